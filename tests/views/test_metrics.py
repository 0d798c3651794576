"""`metrics`: Prometheus text format that Prometheus' own parser reads, with the node's numbers."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent_fsm.node.config import Config, Judgment
from agent_fsm.views.history import history
from agent_fsm.views.metrics import Counters, Family, Sample, collect, counters, exposition
from tests.cli.test_cli import run
from tests.helpers import Crash, World, crash_at, make_world
from tests.views.test_history import good_then_failed

FAMILIES = {
    "agent_fsm_state": "gauge",
    "agent_fsm_upgrades": "counter",
    "agent_fsm_rollbacks": "counter",
    "agent_fsm_upgrade_attempts": "counter",
    "agent_fsm_upgrade_pending": "gauge",
    "agent_fsm_upgrade_pending_attempt": "gauge",
    "agent_fsm_gate_open": "gauge",
    "agent_fsm_owed_effects": "gauge",
    "agent_fsm_info": "gauge",
    "agent_fsm_hold_active": "gauge",
    "agent_fsm_inhibitors": "gauge",
    "agent_fsm_rollbacks_by_reason": "counter",
    "agent_fsm_state_seconds": "gauge",
    "agent_fsm_last_transition_timestamp_seconds": "gauge",
}


def parse(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Parse with prometheus_client; {family: {sorted labels without agent: value}}."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        assert family.name not in out, f"family {family.name} twice"
        samples = out.setdefault(family.name, {})
        for s in family.samples:
            assert s.labels.pop("agent") == "agent"
            samples[tuple(sorted(s.labels.items()))] = s.value
    return out


def types(text: str) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def metrics(world: World) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    return parse(exposition(collect(world.node)))


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text('name = "agent"\n[judgment]\ndeadline_seconds = 60\nsoak_seconds = 5\n')
    return path


class TestParsedByPrometheus:
    def test_every_family_with_its_type(self, world: World) -> None:
        """Every family parses with prometheus_client, with the documented type."""
        world.installed("1.0.0").upgrading("2.0.0")
        assert types(exposition(collect(world.node))) == FAMILIES

    def test_state_gauge_is_one_for_the_current_state_only(self, world: World) -> None:
        """agent_fsm_state has one sample per state; only the current one is 1."""
        world.installed("1.0.0").upgrading("2.0.0")
        state = metrics(world)["agent_fsm_state"]
        assert {labels[0][1]: v for labels, v in state.items()} == {
            "idle": 0, "candidate_running": 1, "judged_ok": 0, "judged_failed": 0,
            "recovering": 0, "converged": 0}

    def test_mid_upgrade_gauges(self, world: World) -> None:
        """Mid-upgrade: pending 1, attempt 1, gate closed, seconds in state, last transition."""
        world.installed("1.0.0").upgrading("2.0.0")
        world.clock.advance(12)
        m = metrics(world)
        assert m["agent_fsm_upgrade_pending"][()] == 1
        assert m["agent_fsm_upgrade_pending_attempt"][()] == 1
        assert m["agent_fsm_gate_open"][()] == 0
        assert m["agent_fsm_state_seconds"][()] == pytest.approx(12)
        assert m["agent_fsm_last_transition_timestamp_seconds"][()] == world.clock.t - 12
        assert m["agent_fsm_info"] == {(("last_good", "1.0.0"), ("selected", "2.0.0")): 1}

    def test_counters_after_a_good_and_a_failed_upgrade(self, world: World) -> None:
        """Upgrades by outcome, rollbacks and attempts count what happened."""
        good_then_failed(world)
        m = metrics(world)
        assert m["agent_fsm_upgrades"] == {(("outcome", "ok"),): 1,
                                           (("outcome", "rolled_back"),): 1}
        assert m["agent_fsm_rollbacks"][()] == 1
        assert m["agent_fsm_upgrade_attempts"][()] == 2
        assert m["agent_fsm_upgrade_pending"][()] == 0
        assert m["agent_fsm_gate_open"][()] == 1
        assert m["agent_fsm_state_seconds"][()] == pytest.approx(30)

    def test_a_repeated_recover_is_one_rollback(self, world: World) -> None:
        """Recovery run again and again (the unit, then an operator, twice) counts one
        rolled-back upgrade and one rollback."""
        c = world.node.controller
        world.installed("1.0.0").upgrading("2.0.0")
        for _ in range(3):
            c.fire("recover")
        c.fire("recovered")
        m = metrics(world)
        assert m["agent_fsm_upgrades"][(("outcome", "rolled_back"),)] == 1
        assert m["agent_fsm_rollbacks"][()] == 1

    def test_idle_node_has_no_time_in_state(self, world: World) -> None:
        """A node that never moved omits seconds-in-state and last-transition; counters are 0."""
        m = metrics(world)
        assert "agent_fsm_state_seconds" not in m
        assert "agent_fsm_last_transition_timestamp_seconds" not in m
        assert m["agent_fsm_upgrades"] == {(("outcome", "ok"),): 0,
                                           (("outcome", "rolled_back"),): 0}
        assert m["agent_fsm_info"] == {(("last_good", ""), ("selected", "")): 1}

    def test_owed_effects(self, world: World) -> None:
        """An interrupted transition shows how many effects it still owes."""
        world.installed("1.0.0")
        world.node.controller.failpoint = crash_at("settle", 1)
        with pytest.raises(Crash):
            world.node.controller.fire("settle")
        assert metrics(world)["agent_fsm_owed_effects"][()] == 2

    def test_label_values_are_escaped(self) -> None:
        """Quotes, backslashes and newlines in label values survive the parser."""
        odd = 'a"b\\c\nd'
        text = exposition((Family("x_info", "gauge", "help \\ text",
                                  (Sample((("agent", "agent"), ("v", odd)), 1.0),)),))
        assert parse(text) == {"x_info": {(("v", odd),): 1.0}}


class TestCountersSurviveTrimming:
    def test_counts_survive_history_trimming(self, tmp_path: Path) -> None:
        """Counters are kept in the state file: trimming history to two entries loses none."""
        world = make_world(tmp_path / "root", Config(name="agent", history_limit=2,
                                                     judgment=Judgment(deadline_seconds=60)))
        good_then_failed(world)
        doc = world.node.store.read()
        assert [e.trigger for e in history(world.node).entries] == ["recover", "recovered"]
        assert len(world.node.store.history()) < 4  # the journal itself is bounded too
        assert counters(doc) == Counters(upgrades_ok=1, upgrades_rolled_back=1, rollbacks=1,
                                         attempts=2)

    def test_no_double_count_while_it_is_kept(self, world: World) -> None:
        """A result whose transition is still in history counts once."""
        good_then_failed(world)
        assert counters(world.node.store.read()).upgrades_rolled_back == 1


class TestCommand:
    def test_stdout(self, tmp_path: Path, cfg: Path) -> None:
        """`agent-fsm metrics` prints the text format, parsed by prometheus_client."""
        world = good_then_failed(make_world(tmp_path / "root"))
        proc = run("--config", str(cfg), "--root", str(world.root), "metrics")
        assert proc.returncode == 0, proc.stderr
        m = parse(proc.stdout)
        assert m["agent_fsm_state"][(("state", "converged"),)] == 1
        assert m["agent_fsm_upgrades"][(("outcome", "rolled_back"),)] == 1

    def test_output_file_is_written_atomically_and_readable(self, tmp_path: Path,
                                                            cfg: Path) -> None:
        """--output PATH replaces the file whole (mode 0644), leaves no temp file, prints nothing."""
        world = good_then_failed(make_world(tmp_path / "root"))
        collector = tmp_path / "textfile"
        target = collector / "agent-fsm.prom"
        collector.mkdir()
        target.write_text("old\n")
        proc = run("--config", str(cfg), "--root", str(world.root), "metrics", "--output",
                   str(target))
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == "" and proc.stderr == ""
        assert types(target.read_text()) == FAMILIES
        assert stat.S_IMODE(os.stat(target).st_mode) == 0o644
        assert os.listdir(collector) == ["agent-fsm.prom"]

    def test_unwritable_output_is_one_line(self, tmp_path: Path, cfg: Path) -> None:
        """An --output path that cannot be written is exit 1 and one line."""
        blocker = tmp_path / "file"
        blocker.write_text("")
        proc = run("--config", str(cfg), "--root", str(tmp_path / "root"), "metrics",
                   "--output", str(blocker / "x.prom"))
        assert proc.returncode == 1
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1




class TestChannel:
    URL = "https://updates.example.test/stable"

    def _world(self, tmp_path: Path) -> World:
        from agent_fsm.node.channel_config import ChannelConfig

        config = Config(name="agent", channel=ChannelConfig(url=self.URL))
        return make_world(tmp_path / "root", config).installed("1.0.0")

    def test_before_any_follow_only_the_failed_gauge_is_there(self, tmp_path: Path) -> None:
        """A channel configured, never followed: `agent_fsm_channel_last_follow_failed` is 0 and
        nothing else of the channel is exported."""
        got = metrics(self._world(tmp_path))
        assert {k: v for k, v in got.items() if "channel" in k} == {
            "agent_fsm_channel_last_follow_failed": {(("channel", "stable"),): 0.0}}

    def test_the_last_follow_is_exported(self, tmp_path: Path) -> None:
        """A follow that could not reach the server: its outcome, time, the index and root
        versions it believed, and the failed gauge at 1."""
        from agent_fsm.node.channel import record as channel_record

        world = self._world(tmp_path)
        channel_record.write(world.paths.channel_dir, channel_record.Record(
            1_700_000_123.0, channel_record.Outcome.failed, "unreachable; nothing changed", 2,
            channel_record.Seen(7, "sha256:" + "0" * 64)))
        got = metrics(world)
        ch = (("channel", "stable"),)
        assert got["agent_fsm_channel_last_follow_failed"] == {ch: 1.0}
        outcomes = got["agent_fsm_channel_last_follow"]
        assert outcomes[(("channel", "stable"), ("outcome", "failed"))] == 1.0
        assert sum(outcomes.values()) == 1.0 and len(outcomes) == len(channel_record.Outcome)
        assert got["agent_fsm_channel_last_follow_timestamp_seconds"] == {ch: 1_700_000_123.0}
        assert got["agent_fsm_channel_index_version"] == {ch: 7.0}
        assert got["agent_fsm_channel_root_version"] == {ch: 2.0}

    def test_every_metric_is_documented(self, tmp_path: Path) -> None:
        """docs/operations.md's table names every family `metrics` exports, the channel's too."""
        from agent_fsm.node.channel import record as channel_record

        world = self._world(tmp_path)
        channel_record.write(world.paths.channel_dir, channel_record.Record(
            1.0, channel_record.Outcome.up_to_date, "up to date", 1,
            channel_record.Seen(1, "sha256:" + "0" * 64)))
        doc = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
        names = {f.name for f in collect(world.node)}
        assert {n for n in names if f"| `{n}` |" not in doc} == set()
