"""`status`: what an operator sees mid-upgrade, what a program reads, and how it is printed."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_fsm.cli.status_view import channel_view
from agent_fsm.node import config as config_mod
from agent_fsm.node.channel import record as channel_record
from agent_fsm.node.channel_config import ChannelConfig
from agent_fsm.views.status.report import status
from tests.cli.test_cli import ROOT, one_line_error, run
from tests.helpers import World, make_world

# The documented `status --json` fields (docs/operations.md); adding one means documenting it.
STATUS_KEYS = {
    "name", "time", "state", "meaning", "situation", "state_since", "state_seconds",
    "selected", "last_good", "candidate", "releases", "signal", "gate", "held_assets",
    "assets", "assets_compared_with", "assets_error", "selected_damaged", "last_result", "owed",
    "skipped", "allowed",
    "next", "hooks", "hold", "inhibitors", "known_bad", "known_bad_error", "config_fallback",
    "units", "unit_situation", "outbox", "crash_loop", "workload", "way_back", "store",
    "channel",
}
SIGNAL_KEYS = {"from", "to", "attempt", "max_attempts", "started", "deadline", "age_seconds",
               "deadline_in_seconds"}
ASSET_KEYS = {"role", "path", "host_path", "on_disk", "held", "compared", "diff"}
RESULT_KEYS = {"from", "to", "outcome", "started", "time", "reason", "reason_class",
               "publisher_unreachable_since", "channel"}
BROKEN_UNIT = "[Unit]\nDescription=broken ${name}\n"
ANSI = "\x1b["


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text('name = "agent"\n[judgment]\ndeadline_seconds = 60\nsoak_seconds = 5\n')
    return path


@pytest.fixture
def node_world(tmp_path: Path, cfg: Path) -> World:
    """A node whose config is the CLI's, so assets rendered in-process and by the CLI agree."""
    return make_world(tmp_path / "root", config_mod.load(cfg))


def cli(world: World, cfg: Path, *args: str,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run("--config", str(cfg), "--root", str(world.root), *args, env=env)


class TestWhatIsHappening:
    def test_mid_upgrade_signal_age_attempt_and_deadline(self, world: World) -> None:
        """Mid-upgrade, the signal shows its versions, age, attempt of max and the time left."""
        world.installed("1.0.0").upgrading("2.0.0")
        world.clock.advance(20)
        st = status(world.node)
        assert st.state == "candidate_running" and st.candidate == "2.0.0"
        assert st.selected == "2.0.0" and st.last_good == "1.0.0"
        assert st.signal is not None
        assert (st.signal["from"], st.signal["to"], st.signal["attempt"]) == ("1.0.0", "2.0.0", 1)
        assert st.signal["max_attempts"] == 3
        assert st.signal["age_seconds"] == pytest.approx(20)
        assert st.signal["deadline_in_seconds"] == pytest.approx(40)
        assert st.state_seconds == pytest.approx(20)

    def test_held_assets_differ_from_what_the_candidate_would_write(self, world: World) -> None:
        """Held assets are marked held, and the one the candidate would write differently says so."""
        world.installed("1.0.0").upgrading("2.0.0", agent_unit=BROKEN_UNIT)
        st = status(world.node)
        by_role = {a.role: a for a in st.assets}
        assert all(a.held and a.on_disk for a in st.assets)
        assert st.held_assets == tuple(a.path for a in st.assets)
        assert by_role["agent unit"].compared == "differs"
        assert st.assets_compared_with == "2.0.0"
        assert by_role["agent unit"].diff is None  # only on request

    def test_diff_on_request_shows_what_the_candidate_would_change(self, world: World) -> None:
        """With diff, a differing asset carries a unified diff from disk to the candidate's."""
        world.installed("1.0.0").upgrading("2.0.0", agent_unit=BROKEN_UNIT)
        unit = {a.role: a for a in status(world.node, diff=True).assets}["agent unit"]
        assert unit.diff is not None
        assert "+Description=broken agent" in unit.diff
        assert "-Type=notify" in unit.diff
        assert "(2.0.0 would write)" in unit.diff

    def test_converged_assets_match_and_nothing_is_held(self, world: World) -> None:
        """Converged after install, no asset is held and each matches what the release writes."""
        world.installed("1.0.0")
        st = status(world.node)
        assert st.held_assets == () and st.signal is None and st.gate == "open"
        assert [a.compared for a in st.assets] == ["same", "same", "same"]

    def test_mode_drift_is_reported(self, world: World) -> None:
        """A recovery script that lost its exec bit shows as mode_differs, with the modes."""
        world.installed("1.0.0")
        world.paths.recovery_script.chmod(0o644)
        script = {a.role: a for a in status(world.node, diff=True).assets}["recovery script"]
        assert script.compared == "mode_differs"
        assert script.diff == "mode 0644 on disk, 1.0.0 would write 0755\n"

    def test_missing_asset(self, world: World) -> None:
        """A removed unit shows as missing, not as an error."""
        world.installed("1.0.0")
        world.paths.recovery_unit.unlink()
        by_role = {a.role: a for a in status(world.node).assets}
        assert by_role["recovery unit"].compared == "missing"
        assert not by_role["recovery unit"].on_disk

    def test_a_candidate_that_cannot_render_does_not_break_status(self, world: World) -> None:
        """A candidate whose template is unusable still gets a status: compared 'unknown', why."""
        world.installed("1.0.0").upgrading("2.0.0", agent_unit="${nonsense}\n")
        st = status(world.node)
        assert [a.compared for a in st.assets] == ["unknown", "unknown", "unknown"]
        assert st.assets_error is not None and "nonsense" in st.assets_error

    def test_last_result_after_a_good_upgrade(self, world: World) -> None:
        """After a good upgrade the last result names the versions and says ok."""
        world.installed("1.0.0").upgrading("2.0.0")
        world.node.controller.fire("judge_ok")
        world.node.controller.fire("complete")
        st = status(world.node)
        assert st.last_result is not None
        assert (st.last_result["from"], st.last_result["to"], st.last_result["outcome"]) == (
            "1.0.0", "2.0.0", "ok")
        assert st.state == "converged" and st.candidate is None


class TestNextAction:
    def test_idle_suggests_install(self, world: World) -> None:
        """Idle with a stored release, the next action is installing the newest one."""
        world.add_release("1.0.0")
        world.add_release("10.0.0")
        world.add_release("9.0.0")
        nxt = status(world.node).next
        assert nxt.commands == ("agent-fsm install --version 10.0.0",)

    def test_mid_upgrade_wait_or_recover(self, world: World) -> None:
        """While a candidate is judged: wait (deadline given), or roll back with recover."""
        world.installed("1.0.0").upgrading("2.0.0")
        nxt = status(world.node, prog="agent-fsm --root /r").next
        assert nxt.summary.startswith("wait for the judgment of 2.0.0 (attempt 1 of 3, deadline in")
        assert nxt.commands == ("agent-fsm --root /r recover",)

    def test_past_deadline_points_at_the_journal(self, world: World) -> None:
        """Past the deadline, the advice names the journal of the agent unit."""
        world.installed("1.0.0").upgrading("2.0.0")
        world.clock.advance(3600)
        nxt = status(world.node).next
        assert "deadline passed" in nxt.summary
        assert "journalctl -u agent.service" in nxt.summary
        assert nxt.commands == ("agent-fsm recover",)

    def test_judged_failed_and_recovering_offer_recover(self, world: World) -> None:
        """After a failed judgment and during the rollback, recover is the command offered."""
        world.installed("1.0.0").upgrading("2.0.0")
        world.node.controller.fire("judge_failed")
        assert status(world.node).next.commands == ("agent-fsm recover",)
        world.node.controller.fire("recover")
        nxt = status(world.node).next
        assert nxt.summary.startswith("wait: 1.0.0 restarts through agent.service")
        assert "agent-fsm recover" in nxt.commands

    def test_allowed_lists_only_what_an_operator_may_run(self, world: World) -> None:
        """`allowed` holds the operator's triggers the state allows, none of the candidate's or
        the daemon's: mid-upgrade only `recover`."""
        world.installed("1.0.0").upgrading("2.0.0")
        assert status(world.node).allowed == ("recover",)
        world.node.controller.fire("judge_failed")
        assert status(world.node).allowed == ("recover",)

    def test_converged_suggests_an_upgrade_to_the_newest_stored(self, world: World) -> None:
        """Converged with a newer release stored, the next action is upgrading to it."""
        world.installed("2.0.0")
        world.add_release("1.0.0")
        world.add_release("3.0.0")
        assert status(world.node).next.commands == ("agent-fsm upgrade --to 3.0.0 --wait",)

    def test_owed_effects_are_named(self, world: World) -> None:
        """An interrupted transition's owed effects are reported and named in the advice."""
        world.installed("1.0.0")
        doc = world.node.store.read()
        from agent_fsm.node.state.store import Pending

        doc.pending = Pending("settle", "converged", "converged",
                              ["converge_assets", "reload_systemd_if_changed", "open_gate"], 1, {}, 0.0)
        world.node.store.write(doc)
        st = status(world.node)
        assert st.owed is not None and st.owed["effects"] == ["reload_systemd_if_changed", "open_gate"]
        assert st.next.summary.startswith("an interrupted settle still owes reload_systemd_if_changed")

    def test_an_operators_command_that_died_is_said_to_be_finished_by_the_agent(
            self, world: World) -> None:
        """An `upgrade` killed after its signal, before it selected: the advice says the
        running agent abandons it within 5 s, its workload running, so no one runs a command
        by hand."""
        from tests.helpers import Crash, crash_at

        world.installed("1.0.0")
        world.add_release("2.0.0")
        world.node.controller.failpoint = crash_at("begin_upgrade", 4)
        with pytest.raises(Crash):
            world.node.controller.fire("begin_upgrade", release="2.0.0")
        summary = status(world.reopen().node).next.summary
        assert summary.startswith("an interrupted begin_upgrade still owes select_release"), summary
        assert "the running agent abandons it within 5s, its workload left running" in summary


class TestJson:
    def test_key_set_is_pinned(self, node_world: World, cfg: Path) -> None:
        """status --json has exactly the documented keys, at the top, in signal, assets, result."""
        node_world.installed("1.0.0").upgrading("2.0.0")
        node_world.node.controller.fire("recover")
        node_world.node.controller.fire("recovered")
        node_world.upgrading("3.0.0")
        data = json.loads(cli(node_world, cfg, "status", "--json").stdout)
        assert set(data) == STATUS_KEYS
        assert set(data["signal"]) == SIGNAL_KEYS
        assert all(set(a) == ASSET_KEYS for a in data["assets"])
        assert set(data["last_result"]) == RESULT_KEYS
        assert set(data["next"]) == {"summary", "commands"}
        assert data["last_result"]["outcome"] == "rolled_back"

    def test_design_section_8_fields(self, node_world: World, cfg: Path) -> None:
        """The fields DESIGN §8 promises keep their shapes: gate word, held paths, signal."""
        node_world.installed("1.0.0").upgrading("2.0.0")
        data = json.loads(cli(node_world, cfg, "status", "--json").stdout)
        assert data["gate"] == "closed"
        assert [Path(p).name for p in data["held_assets"]] == [
            "agent.service", "agent-recovery.service", "agent-recovery.sh"]
        assert data["signal"]["to"] == "2.0.0"

    def test_diff_in_json(self, node_world: World, cfg: Path) -> None:
        """status --json --diff carries the diff of a differing asset."""
        node_world.installed("1.0.0").upgrading("2.0.0", agent_unit=BROKEN_UNIT)
        data = json.loads(cli(node_world, cfg, "status", "--json", "--diff").stdout)
        unit = data["assets"][0]
        assert unit["compared"] == "differs" and "+Description=broken agent" in unit["diff"]

    def test_every_field_is_documented(self) -> None:
        """docs/operations.md names every status --json field."""
        doc = (ROOT / "docs" / "operations.md").read_text()
        for key in STATUS_KEYS | SIGNAL_KEYS | ASSET_KEYS:
            assert f"`{key}`" in doc, key


class TestHuman:
    def test_mid_upgrade_view(self, node_world: World, cfg: Path) -> None:
        """The human view names the state and its meaning, the signal, held assets and next."""
        node_world.installed("1.0.0").upgrading("2.0.0", agent_unit=BROKEN_UNIT)
        proc = cli(node_world, cfg, "status")
        assert proc.returncode == 0, proc.stderr
        text = proc.stdout
        assert "candidate_running — An upgrade is pending" in text
        assert "upgrade 1.0.0 → 2.0.0, attempt 1 of 3" in text
        assert "held: the last-good's, kept byte for byte" in text
        assert "compared with what 2.0.0 would write" in text
        assert "differs from 2.0.0's  (held)" in text
        words = " ".join(text.split())  # long lines wrap at the terminal's width
        assert f"roll back now: agent-fsm --config {cfg} --root {node_world.root} recover" in words

    def test_diff_view(self, node_world: World, cfg: Path) -> None:
        """status --diff prints the unified diff under the view."""
        node_world.installed("1.0.0").upgrading("2.0.0", agent_unit=BROKEN_UNIT)
        text = cli(node_world, cfg, "status", "--diff").stdout
        assert "+Description=broken agent" in text and "@@" in text

    def test_piped_output_has_no_escapes(self, node_world: World, cfg: Path) -> None:
        """Piped, status is plain text: no ANSI escape sequences."""
        node_world.installed("1.0.0").upgrading("2.0.0", agent_unit=BROKEN_UNIT)
        proc = cli(node_world, cfg, "status", "--diff")
        assert proc.stdout and ANSI not in proc.stdout

    def test_terminal_is_coloured_and_no_color_is_respected(self, node_world: World,
                                                              cfg: Path) -> None:
        """On a terminal status is coloured; with NO_COLOR set it has no escapes at all."""
        node_world.installed("1.0.0").upgrading("2.0.0")
        args = ("--config", str(cfg), "--root", str(node_world.root), "status")
        coloured = run_on_tty(*args)
        plain = run_on_tty(*args, env={"NO_COLOR": "1"})
        assert "candidate_running" in coloured and ANSI in coloured
        assert "candidate_running" in plain and ANSI not in plain

    def test_empty_root(self, tmp_path: Path, cfg: Path) -> None:
        """On an empty root the view says nothing is installed and how to install."""
        proc = run("--config", str(cfg), "--root", str(tmp_path / "r"), "status")
        assert proc.returncode == 0
        assert "idle" in proc.stdout and "agent-fsm --config" in proc.stdout
        assert "install --version V" in proc.stdout

    def test_broken_signal_is_one_line(self, node_world: World, cfg: Path) -> None:
        """An unreadable signal file is one clear line and exit 1, not a traceback."""
        node_world.installed("1.0.0").upgrading("2.0.0")
        node_world.paths.signal_file.write_text("{")
        proc = cli(node_world, cfg, "status")
        assert proc.returncode == 1
        assert "upgrade signal" in one_line_error(proc)


class TestWatch:
    def test_count_refreshes_then_exits(self, node_world: World, cfg: Path) -> None:
        """--watch --count N prints N snapshots (piped) and exits 0."""
        node_world.installed("1.0.0")
        proc = cli(node_world, cfg, "status", "--watch", "--interval", "0.1", "--count", "3")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.count("state        converged") == 3
        assert ANSI not in proc.stdout

    def test_json_watch_is_one_object_per_line(self, node_world: World, cfg: Path) -> None:
        """--watch --json prints one JSON object per line, each a full status."""
        node_world.installed("1.0.0")
        proc = cli(node_world, cfg, "status", "--watch", "--json", "--interval", "0.1",
                   "--count", "2")
        lines = proc.stdout.splitlines()
        assert len(lines) == 2
        assert all(set(json.loads(line)) == STATUS_KEYS for line in lines)

    def test_watch_follows_changes_until_interrupted(self, node_world: World, cfg: Path) -> None:
        """A running --watch shows a change made meanwhile and exits 0 on Ctrl-C (SIGINT)."""
        node_world.installed("1.0.0")
        node_world.add_release("2.0.0")
        env = {k: v for k, v in os.environ.items() if k != "AGENT_FSM_CONFIG"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent_fsm", "--config", str(cfg), "--root",
             str(node_world.root), "status", "--watch", "--json", "--interval", "0.1"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        try:
            assert proc.stdout is not None
            assert json.loads(proc.stdout.readline())["state"] == "converged"
            node_world.node.controller.fire("begin_upgrade", release="2.0.0")
            states = set()
            deadline = time.monotonic() + 20
            while "candidate_running" not in states and time.monotonic() < deadline:
                states.add(json.loads(proc.stdout.readline())["state"])
            assert "candidate_running" in states
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=10) == 0
        finally:
            proc.kill()
            proc.wait()

    def test_interval_and_count_need_watch(self, tmp_path: Path, cfg: Path) -> None:
        """--interval or --count without --watch is a usage error (exit 2)."""
        proc = run("--config", str(cfg), "--root", str(tmp_path), "status", "--count", "2")
        assert proc.returncode == 2 and "only with --watch" in proc.stderr

    def test_live_on_a_terminal(self, node_world: World, cfg: Path) -> None:
        """On a terminal --watch redraws in place and says how to stop."""
        node_world.installed("1.0.0")
        text = run_on_tty("--config", str(cfg), "--root", str(node_world.root), "status",
                          "--watch", "--interval", "0.1", "--count", "2")
        assert "Ctrl-C to stop" in text and "converged" in text


def run_on_tty(*args: str, env: dict[str, str] | None = None, timeout: float = 30) -> str:
    """Run agent-fsm with a pseudo-terminal as its stdout and stderr; return what it wrote."""
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("AGENT_FSM_CONFIG", "NO_COLOR", "COLUMNS", "FORCE_COLOR")}
    full_env.update({"TERM": "xterm-256color", "COLUMNS": "200", **(env or {})})
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "agent_fsm", *args], stdin=subprocess.DEVNULL,
                            stdout=slave, stderr=slave, env=full_env, cwd=ROOT)
    os.close(slave)
    chunks = []
    end = time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        os.close(master)
    return b"".join(chunks).decode(errors="replace")


def _timer_at(tmp_path: Path, at: float) -> Path:
    """A systemctl stand-in whose `show` says the follow timer is active and next elapses at
    `at` (as systemd 252 prints it under TZ=UTC)."""
    stub = tmp_path / "systemctl"
    stamp = time.strftime("%a %Y-%m-%d %H:%M:%S UTC", time.gmtime(at))
    stub.write_text("#!/bin/sh\nprintf 'ActiveState=active\\nUnitFileState=enabled\\n"
                    f"NextElapseUSecRealtime={stamp}\\n'\n")
    stub.chmod(0o755)
    return stub


class TestOutsideTheWindow:
    def test_an_eligible_version_not_taken_waits_for_the_window(self, tmp_path: Path) -> None:
        """A last follow that found 1.2.0 eligible and did not take it (its download failed),
        the timer due in 25 s: status says 1.2.0 waits, outside the window, next at that run;
        a version not eligible, or not newer, is not listed."""
        world = make_world(tmp_path / "root")
        world.installed("1.0.0")
        at = world.clock.now() + 25
        world = make_world(world.root, world.node.config._replace(
            systemctl=(str(_timer_at(tmp_path, at)),),
            channel=ChannelConfig(url="https://updates.example.test/stable")),
            world.systemd, world.publisher, world.clock)
        channel_record.write(world.node.paths.channel_dir, channel_record.Record(
            world.clock.now() - 600, channel_record.Outcome.failed,
            "could not fetch 1.2.0: the server did not answer in time", 1, available=(
                channel_record.Available("1.3.0", 10, 37, "rollout 10 %, this node's bucket 37"),
                channel_record.Available("1.2.0", 100, 37, None),
                channel_record.Available("1.0.0", 100, 12, None))))
        ch = status(world.node).channel
        assert ch is not None
        assert ch["waiting"] == {"reason": "outside the window", "next_run": at,
                                 "eligible": ["1.2.0"]}
        shown = channel_view(ch).plain
        stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))
        assert f"follow timer active: outside the window: next at {stamp}" in shown
        assert f"1.2.0: eligible, not taken yet: outside the window: next at {stamp}" in shown
        assert "1.0.0:" not in shown and "1.3.0: rollout 10 %" in shown

    def test_no_run_due_is_no_waiting(self, tmp_path: Path) -> None:
        """The timer's next run already passed (a follow is starting): no waiting is shown."""
        world = make_world(tmp_path / "root")
        world.installed("1.0.0")
        at = world.clock.now() - 1
        world = make_world(world.root, world.node.config._replace(
            systemctl=(str(_timer_at(tmp_path, at)),),
            channel=ChannelConfig(url="https://updates.example.test/stable")),
            world.systemd, world.publisher, world.clock)
        ch = status(world.node).channel
        assert ch is not None and ch["waiting"] is None and ch["next_run"] == at
        assert "outside the window" not in channel_view(ch).plain
