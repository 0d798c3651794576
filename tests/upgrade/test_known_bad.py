"""Known-bad versions: a version that rolled back on this node is refused by the next upgrade
unless forced, is shown by `status` and `release list`, and a judged-ok upgrade clears it; the
record never stands in the way back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_fsm.actions.recover import recover
from agent_fsm.actions.releases import pruning
from agent_fsm.actions.upgrade import begin_upgrade
from agent_fsm.errors import Refused
from agent_fsm.node import config as config_mod
from agent_fsm.node.records import known_bad
from agent_fsm.views.status.report import status
from tests.cli.test_cli import one_line_error, run
from tests.helpers import Crash, World, crash_at, env_with_stub_systemctl, make_world

CHECK_LINE = "ping: health endpoint answered 503"


def rolled_back(world: World, to: str = "2.0.0") -> World:
    """Converged on 1.0.0 after an upgrade to `to` failed a check and rolled back."""
    if not world.node.effectors.releases.exists("1.0.0"):
        world.installed("1.0.0")
    if not world.node.effectors.releases.exists(to):
        world.add_release(to)
    c = world.node.controller
    c.fire("begin_upgrade", release=to)
    c.fire("candidate_started")
    c.fire("judge_failed", reason=f"checks still failing at the deadline: {CHECK_LINE}",
           reason_class="check_failed")
    recover(world.node)
    c.fire("recovered")
    assert world.node.store.read().state == "converged"
    return world


def record(world: World) -> Path:
    return world.paths.known_bad_file


class TestRefused:
    def test_a_rolled_back_version_is_refused_saying_when_why_and_force(self,
                                                                        world: World) -> None:
        """After 2.0.0 rolled back, `upgrade --to 2.0.0` is refused (exit 3) with when it failed,
        why, and `--force`; nothing changes."""
        rolled_back(world)
        world.clock.advance(60)
        with pytest.raises(Refused) as exc:
            begin_upgrade(world.node, "2.0.0")
        text = str(exc.value)
        assert "known bad" in text and CHECK_LINE in text and "check_failed" in text
        assert "--force" in text and " UTC" in text and "\n" not in text
        assert exc.value.exit_code == 3
        assert world.node.effectors.releases.selected() == "1.0.0"
        assert world.node.effectors.signal() is None

    def test_other_versions_are_not_refused(self, world: World) -> None:
        """Only the version that rolled back is marked: an upgrade to another starts."""
        rolled_back(world)
        world.add_release("2.0.1")
        doc = begin_upgrade(world.node, "2.0.1")
        assert doc.state == "candidate_running"

    def test_force_goes_past_the_mark_and_a_judged_ok_upgrade_clears_it(self,
                                                                       world: World) -> None:
        """`--force` starts the upgrade anyway; judged ok, the version is no longer known bad."""
        rolled_back(world)
        c = world.node.controller
        begin_upgrade(world.node, "2.0.0", force=True)
        assert [m["version"] for m in status(world.node).known_bad[0]] == ["2.0.0"]
        c.fire("candidate_started")
        c.fire("judge_ok")
        c.fire("complete")
        assert status(world.node).known_bad == ((), None)
        assert known_bad.read(record(world)).marks == {}

    def test_a_forced_upgrade_that_fails_again_stays_marked(self, world: World) -> None:
        """A forced retry that rolls back again keeps the mark, with the newer failure."""
        rolled_back(world)
        first = known_bad.read(record(world)).marks["2.0.0"].time
        world.clock.advance(100)
        c = world.node.controller
        begin_upgrade(world.node, "2.0.0", force=True)
        c.fire("candidate_started")
        c.fire("judge_failed", reason="the workload exited while being judged",
               reason_class="crashed")
        recover(world.node)
        c.fire("recovered")
        mark = known_bad.read(record(world)).marks["2.0.0"]
        assert mark.time > first and mark.reason_class == "crashed"
        assert known_bad.read(record(world)).rollbacks == {"check_failed": 1, "crashed": 1}


class TestRecord:
    def test_status_lists_version_time_and_reason(self, world: World) -> None:
        """`status --json` has `known_bad`: [{version, time, reason, ...}] with the check's line."""
        rolled_back(world)
        marks = status(world.node).to_json()["known_bad"]
        assert [(m["version"], m["reason_class"]) for m in marks] == [("2.0.0", "check_failed")]
        assert CHECK_LINE in marks[0]["reason"]
        assert marks[0]["time"] == world.node.store.read().last_result["time"]  # type: ignore[index]

    def test_status_does_not_suggest_a_known_bad_version(self, world: World) -> None:
        """`next` suggests upgrading to the newest stored version that is not known bad."""
        rolled_back(world)
        assert "2.0.0" not in " ".join(status(world.node).next.commands)
        world.add_release("1.5.0")
        assert status(world.node).next.commands == ("agent-fsm upgrade --to 1.5.0 --wait",)

    def test_a_rollback_re_run_after_a_crash_marks_and_counts_once(self, world: World) -> None:
        """A crash after the mark and before its progress is recorded re-runs it: one mark, one
        count."""
        world.installed("1.0.0")
        world.upgrading("2.0.0")
        world.node.controller.failpoint = crash_at("recover", 2)
        with pytest.raises(Crash, match="recover:2"):
            world.node.controller.fire("recover", reason="by hand", reason_class="manual")
        again = world.reopen()
        doc = again.node.store.read()
        assert doc.pending is not None and doc.pending.effects[1] == "mark_known_bad"
        doc.pending.done = 1  # as if the mark's progress had not reached the disk
        with again.node.store.locked():
            again.node.store.write(doc)
        again.node.controller.resume()
        assert known_bad.read(record(world)).rollbacks == {"manual": 1}

    def test_a_damaged_record_never_blocks_a_rollback(self, world: World) -> None:
        """With the record damaged, the rollback still converges on the last-good (the failed
        mark is logged as skipped) and the damaged file is left as it was."""
        world.installed("1.0.0")
        world.upgrading("2.0.0")
        record(world).write_text("{not json")
        recover(world.node)
        world.node.controller.fire("recovered")
        doc = world.node.store.read()
        assert doc.state == "converged" and world.node.effectors.releases.selected() == "1.0.0"
        assert record(world).read_text() == "{not json"
        assert any(s["effect"] == "mark_known_bad" for s in doc.skipped)

    def test_a_damaged_record_refuses_upgrades_until_forced(self, world: World) -> None:
        """A damaged record refuses upgrades, naming the file and `--force`, which goes past it."""
        world.installed("1.0.0")
        world.add_release("2.0.0")
        record(world).write_bytes(known_bad.KIND.encode({"versions": {"2.0.0": {"time": -1}},
                                                         "rollbacks": {}}))
        with pytest.raises(Refused, match=r"known-bad record .* damaged .*versions\.2\.0\.0"):
            begin_upgrade(world.node, "2.0.0")
        assert status(world.node).to_json()["known_bad_error"] is not None
        assert begin_upgrade(world.node, "2.0.0", force=True).state \
            == "candidate_running"

    def test_prune_may_remove_a_known_bad_version(self, world: World) -> None:
        """`release prune` does not protect a known-bad version."""
        rolled_back(world)
        assert "2.0.0" not in pruning.protected(world.node, world.node.store.read())
        pruning.prune(world.node, ("2.0.0",))
        assert not world.node.effectors.releases.exists("2.0.0")

    def test_written_atomically_and_readable_by_status(self, world: World) -> None:
        """The record is one JSON file, mode 0644, with no temporary file left beside it."""
        rolled_back(world)
        assert record(world).stat().st_mode & 0o777 == 0o644
        assert [p.name for p in record(world).parent.glob("known-bad*")] == ["known-bad.json"]
        assert json.loads(record(world).read_text())["versions"]["2.0.0"]["reason_class"] \
            == "check_failed"


class TestCli:
    def test_upgrade_refused_exit_3_one_line_and_release_list_marks_it(self,
                                                                       tmp_path: Path) -> None:
        """`upgrade --to 2.0.0` exits 3 with one line; `release list` marks it, human and JSON;
        `--force` names the mark it goes past."""
        cfg = tmp_path / "config.toml"
        cfg.write_text('name = "agent"\n[judgment]\ndeadline_seconds = 60\nsoak_seconds = 5\n')
        world = rolled_back(make_world(tmp_path / "root", config_mod.load(cfg)))
        env = env_with_stub_systemctl(tmp_path)

        def cli(*args: str):  # type: ignore[no-untyped-def]
            return run("--config", str(cfg), "--root", str(world.root), *args, env=env)

        refused = cli("upgrade", "--to", "2.0.0")
        assert refused.returncode == 3
        line = one_line_error(refused)
        assert "known bad" in line and "--force" in line and CHECK_LINE in line
        listed = {r["version"]: r for r in json.loads(cli("release", "list", "--json").stdout)}
        assert listed["2.0.0"]["known_bad"]["reason_class"] == "check_failed"
        assert listed["1.0.0"]["known_bad"] is None
        human = cli("release", "list").stdout
        assert "KNOWN BAD" in next(ln for ln in human.splitlines() if ln.startswith("2.0.0"))
        assert "known bad" in cli("status").stdout
        forced = cli("upgrade", "--to", "2.0.0", "--force")
        assert forced.returncode == 0, forced.stderr
        assert "--force: going past the known-bad mark of 2.0.0" in forced.stdout
