"""Start limits as agent-fsm's policy: the agent unit rendered for the host's systemd, the
last-good's start check that bounds a candidate, and a crash loop kept as one history entry."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from agent_fsm.actions.recover import recover
from agent_fsm.agent.start_check import ALLOW, REFUSE, start_check
from agent_fsm.errors import SystemdError
from agent_fsm.node.assets import render
from agent_fsm.node.config import Config
from agent_fsm.node.state.store import CRASH_LOOP_WINDOW
from agent_fsm.testing import FakeClock, FakePublisher, FakeSystemd
from agent_fsm.views.status.report import status
from agent_fsm.wiring import open_node
from tests.helpers import World

GROWTH = ("RestartSteps=", "RestartMaxDelaySec=", "RestartMode=direct")


def _unit(world: World) -> str:
    return world.paths.agent_unit.read_text()


def _settings(world: World) -> str:
    """The agent unit without its comments."""
    return "".join(line for line in _unit(world).splitlines(keepends=True)
                   if not line.startswith("#"))


class TestRenderedForTheHostsSystemd:
    @pytest.mark.parametrize("version", [254, 257])
    def test_newer_systemd_gets_growing_delays_and_direct_restarts(self, world: World,
                                                                   version: int) -> None:
        """On systemd 254 and later the agent unit restarts with growing delays (up to 60 s)
        and an automatic restart does not start recovery (RestartMode=direct)."""
        world.systemd.systemd_version = version
        world.installed("1.0.0")
        unit = _unit(world)
        assert "RestartSteps=6\nRestartMaxDelaySec=60\nRestartMode=direct\n" in unit
        assert "StartLimitIntervalSec=0\n" in unit and "StartLimitBurst" not in unit

    def test_systemd_252_gets_only_keys_it_knows(self, world: World) -> None:
        """On systemd 252 the agent unit has none of the keys 252 does not know, and says why
        its restarts keep a constant delay."""
        world.systemd.systemd_version = 252
        world.installed("1.0.0")
        assert not any(key in _settings(world) for key in GROWTH)
        assert "# systemd 252: RestartSteps=" in _unit(world)
        assert "StartLimitIntervalSec=0\n" in _settings(world)

    def test_a_version_that_cannot_be_asked_renders_for_the_oldest_and_is_asked_again(
            self, world: World) -> None:
        """When systemctl cannot tell its version the unit is rendered without the newer keys,
        and the next render asks again; once known, it is asked once a boot, not per render."""
        world.systemd.fail = {"version"}
        world.systemd.systemd_version = 257
        world.installed("1.0.0")
        assert "of unknown version" in _unit(world) and "RestartSteps" not in _settings(world)
        world.systemd.fail = set()
        world.node.controller.fire("settle")
        assert "RestartSteps=6" in _unit(world)
        asked = world.systemd.versions_asked
        world.node.controller.fire("settle")
        world.node.effectors.rendered()
        assert world.systemd.versions_asked == asked

    def test_a_version_asked_in_another_boot_is_asked_again(self, world: World) -> None:
        """The version kept from an earlier boot is not trusted: systemd may have been
        upgraded since; the next render asks again."""
        world.systemd.systemd_version = 252
        world.installed("1.0.0")
        render.SYSTEMD_KIND.write(world.paths.systemd_file, {"version": 252, "boot_id": "old"})
        world.systemd.systemd_version = 257
        world.node.controller.fire("settle")
        assert "RestartSteps=6" in _unit(world)

    def test_an_older_agent_fsm_renders_these_templates(self) -> None:
        """The shipped templates use only the placeholders agent-fsm knew before the unit was
        rendered by systemd version, so an older agent-fsm still adds, installs and activates
        a release of this one (the version-dependent lines replace a comment line instead)."""
        import string
        from importlib import resources

        before = {"name", "version", "config", "state_dir", "lib_dir", "unit_dir", "run_dir",
                  "runtime_directory", "selected", "last_good", "agent_unit", "recovery_unit",
                  "recovery_script", "timeout_start_sec", "max_attempts", "restart_sec"}
        for name in render.TEMPLATES:
            text = (resources.files("agent_fsm") / "templates" / name).read_text()
            used = {m.group("named") or m.group("braced")
                    for m in string.Template.pattern.finditer(text)
                    if m.group("named") or m.group("braced")}
            assert used <= before, (name, used - before)
        unit = (resources.files("agent_fsm") / "templates" / "agent.service").read_text()
        assert render.GROWTH_MARKER in unit

    @pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
    def test_the_unit_rendered_for_this_hosts_systemd_verifies_clean(self,
                                                                    tmp_path: Path) -> None:
        """Rendered for the systemd this machine runs, the agent unit passes `systemd-analyze
        verify` with nothing on stderr; on a host older than 254, the one rendered for 257
        would draw warnings there (why it is rendered by version)."""
        host = int(subprocess.run(["systemctl", "--version"], capture_output=True, text=True,
                                  check=True).stdout.split()[1])

        def stderr_of_verify(version: int) -> str:
            base = tmp_path / str(version)
            config = Config(name="agentx", state_dir=base / "state", lib_dir=base / "lib",
                            unit_dir=base / "units", run_dir=Path("/run/agentx-never-written"),
                            bin_link=None)
            systemd = FakeSystemd(systemd_version=version)
            world = World(base, open_node(config, None, systemd=systemd,
                                          publisher=FakePublisher(), clock=FakeClock()),
                          systemd, FakePublisher(), FakeClock())
            stub = world.add_release("1.0.0") / "bin" / "agent-fsm"
            stub.parent.mkdir()
            stub.write_text("#!/bin/sh\nexit 0\n")
            stub.chmod(0o755)
            world.record_digest("1.0.0")
            world.node.controller.fire("install", release="1.0.0")
            units = [str(world.paths.agent_unit), str(world.paths.recovery_unit)]
            return subprocess.run(["systemd-analyze", "verify", "--man=no", *units],
                                  capture_output=True, text=True, check=False, cwd=base).stderr

        assert stderr_of_verify(host) == ""
        if host < render.RESTART_GROWTH_SINCE:
            assert "RestartSteps" in stderr_of_verify(257)


class TestStartCheck:
    def test_without_an_upgrade_it_lets_every_start_go_on_and_writes_nothing(
            self, world: World) -> None:
        """A converged agent's starts are neither counted nor refused."""
        world.installed("1.0.0")
        before = sorted(p.name for p in world.paths.state_dir.iterdir())
        assert [start_check(world.node, world.systemd) for _ in range(10)] == [ALLOW] * 10
        assert sorted(p.name for p in world.paths.state_dir.iterdir()) == before

    def test_a_candidate_gets_max_attempts_starts_then_recovery(self, world: World) -> None:
        """A candidate that crashes before its own daemon counts is counted by the start check
        all the same: max_attempts starts go on, the next one starts the recovery unit and is
        refused, and so is every start after it until recovery selects the last-good."""
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world.node.controller.fire("begin_upgrade", release="2.0.0")
        most = world.node.config.judgment.max_attempts
        before = len(world.systemd.calls)
        assert [start_check(world.node, world.systemd) for _ in range(most)] == [ALLOW] * most
        assert [c for c in world.systemd.calls[before:] if c[0] != "show"] == []
        assert start_check(world.node, world.systemd) == REFUSE
        assert [c for c in world.systemd.calls[before:] if c[0] != "show"] == [
            ("start", "agent-recovery.service")]
        assert start_check(world.node, world.systemd) == REFUSE  # asks again: a failed start is retried
        sig = world.node.signal()
        assert sig is not None and (sig.starts, sig.attempt) == (most + 2, 0)
        world.node.controller.fire("recover")
        assert start_check(world.node, world.systemd) == ALLOW  # the last-good starts

    def test_a_candidate_judged_ok_is_started_whatever_its_count(self, world: World) -> None:
        """A candidate judged ok whose `complete` a crash left owed, its starts used up on the
        way: its next start goes on (it only finishes `complete`), instead of being refused for
        ever with a recovery that has nothing to roll back."""
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world.node.controller.fire("begin_upgrade", release="2.0.0")
        most = world.node.config.judgment.max_attempts
        assert [start_check(world.node, world.systemd) for _ in range(most)] == [ALLOW] * most
        world.node.controller.fire("candidate_started")
        world.node.controller.fire("judge_ok")
        before = len(world.systemd.calls)
        assert start_check(world.node, world.systemd) == ALLOW
        assert [c for c in world.systemd.calls[before:] if c[0] != "show"] == []

    def test_the_candidates_own_count_keeps_the_start_checks(self, world: World) -> None:
        """The candidate's daemon counting its attempt keeps the starts counted before it."""
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world.node.controller.fire("begin_upgrade", release="2.0.0")
        start_check(world.node, world.systemd)
        world.node.controller.fire("candidate_started")
        sig = world.node.signal()
        assert sig is not None and (sig.starts, sig.attempt) == (1, 1)
        assert status(world.node).signal["starts"] == 1  # type: ignore[index]

    def test_a_refused_start_whose_recovery_unit_cannot_start_is_still_refused(
            self, world: World) -> None:
        """When the recovery unit cannot be started, the start is refused all the same (the
        candidate's code never runs again), and the next start asks again."""
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world.node.controller.fire("begin_upgrade", release="2.0.0")
        for _ in range(world.node.config.judgment.max_attempts):
            start_check(world.node, world.systemd)
        world.systemd.fail = {"start"}
        assert start_check(world.node, world.systemd) == REFUSE


    def test_a_start_that_cannot_be_counted_asks_for_recovery_and_is_refused(
            self, world: World, monkeypatch: pytest.MonkeyPatch) -> None:
        """A full state dir at a candidate's start (the signal cannot be written) starts the
        recovery unit and refuses the start, so the way back is tried while the disk is full;
        the signal is left as it was."""
        import errno

        from tests.reliability.test_hostile import FailingDisk

        world.installed("1.0.0")
        world.add_release("2.0.0")
        world.node.controller.fire("begin_upgrade", release="2.0.0")
        before = world.paths.signal_file.read_bytes()
        calls = len(world.systemd.calls)
        FailingDisk(monkeypatch, "write", 1, errno.ENOSPC)
        assert start_check(world.node, world.systemd) == REFUSE
        monkeypatch.undo()
        assert [c for c in world.systemd.calls[calls:] if c[0] != "show"] == [
            ("start", "agent-recovery.service")]
        assert world.paths.signal_file.read_bytes() == before

    def test_the_rollback_says_the_starts_were_used_up(self, world: World,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
        """The recovery unit's rollback after the start check refused a start records why:
        max_attempts failed starts, the next refused (not the refused start's exit status)."""
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world.node.controller.fire("begin_upgrade", release="2.0.0")
        while start_check(world.node, world.systemd) == ALLOW:
            pass
        world.systemd.shown = {"Result": "exit-code", "ExecMainStatus": "0", "NRestarts": "3"}
        recover(world.node, by_unit=True)
        result = world.node.store.read().last_result
        assert result is not None and result["reason_class"] == "crashed"
        assert result["reason"].startswith("agent.service failed 3 start(s) in a row")

    def test_a_check_that_fails_unexpectedly_lets_the_start_go_on(self, world: World) -> None:
        """A start check that cannot run (a config it cannot read, a state file it cannot
        read) lets the start go on rather than keep the agent down (a signal it cannot read
        while the state file knows the upgrade refuses it: tests/upgrade/test_lost_signal.py)."""
        from agent_fsm.agent.start_check import main
        from agent_fsm.errors import ConfigError

        def unreadable() -> World:
            raise ConfigError("config /etc/agent-fsm/config.toml: not TOML")

        assert main(unreadable) == ALLOW  # type: ignore[arg-type]
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world.node.controller.fire("begin_upgrade", release="2.0.0")
        world.paths.signal_file.unlink()
        world.paths.state_file.write_text("{damaged")
        assert main(lambda: world.node) == ALLOW


class TestAnOlderUnitsStartLimit:
    """An agent unit held from an older release still has `StartLimitBurst=max_attempts`."""

    @staticmethod
    def _judged_ok(world: World) -> World:
        world.installed("1.0.0")
        world.add_release("2.0.0")
        for trigger, args in (("begin_upgrade", {"release": "2.0.0"}), ("candidate_started", {}),
                              ("judge_ok", {})):
            world.node.controller.fire(trigger, **args)
        return world

    def test_recover_starts_a_judged_ok_candidate_systemd_gave_up_on(self, world: World) -> None:
        """A candidate judged ok whose crashes inside `complete` used up the unit's start
        limit: the recovery unit's `recover` resets it and starts the agent, so its next start
        finishes `complete`, instead of leaving the node failed for good (found by the model
        check)."""
        self._judged_ok(world)
        world.systemd.shown = {"ActiveState": "failed", "Result": "start-limit-hit"}
        before = len(world.systemd.calls)
        done = recover(world.node)
        assert [c for c in world.systemd.calls[before:] if c[0] != "show"] == [
            ("reset-failed", "agent.service"), ("start", "agent.service")]
        assert done.state == "judged_ok" and "start-limit-hit" in done.message
        assert world.node.releases.selected() == "2.0.0" and world.node.signal() is not None

    def test_recover_starts_a_converged_agent_systemd_gave_up_on(
            self, world: World, monkeypatch: pytest.MonkeyPatch) -> None:
        """A converged agent whose unit systemd still has with the older start limit (the
        reload of `complete` failed) and gave up on: the recovery unit's `recover` resets the
        limit and starts it, as a converged agent is restarted for ever (found by the model
        check); where systemd cannot say, that run fails, to be tried again."""
        world.installed("1.0.0")
        world.systemd.shown = {"ActiveState": "failed", "Result": "start-limit-hit"}
        before = len(world.systemd.calls)
        done = recover(world.node, by_unit=True)
        assert [c for c in world.systemd.calls[before:] if c[0] != "show"] == [
            ("reset-failed", "agent.service"), ("start", "agent.service")]
        assert done.message.startswith("nothing to roll back: no upgrade is pending; "
                                       "agent.service had failed (result start-limit-hit)")
        world.systemd.fail = {"show"}
        with pytest.raises(SystemdError):
            recover(world.node, by_unit=True)
        # An operator's: told, not failed.
        assert recover(world.node).message == "nothing to roll back: no upgrade is pending"

    def test_a_rollback_whose_restart_systemd_refused_is_tried_again(
            self, world: World, monkeypatch: pytest.MonkeyPatch) -> None:
        """A rollback whose start-limit reset failed (let pass), so that systemd refused its
        restart and left the agent unit failed: the recovery unit's `recover` fails, to be run
        again (nothing else would), and the next try resets and restarts (found by the model
        check)."""
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world.node.controller.fire("begin_upgrade", release="2.0.0")
        world.systemd.fail = {"reset-failed"}
        world.systemd.shown = {"ActiveState": "failed", "Result": "start-limit-hit"}
        with pytest.raises(SystemdError, match=r"did not start agent\.service: it is failed"):
            recover(world.node, by_unit=True)
        assert world.node.store.read().state == "recovering"
        world.systemd.fail = set()
        world.systemd.shown = {"ActiveState": "activating"}
        before = len(world.systemd.calls)
        assert recover(world.node, by_unit=True).state == "recovering"
        assert [c for c in world.systemd.calls[before:] if c[0] != "show"] == [
            ("reset-failed", "agent.service"), ("restart", "agent.service")]

    def test_recover_leaves_a_judged_ok_candidate_that_runs_alone(self, world: World) -> None:
        """While the judged-ok candidate's unit is not failed (it runs or is being restarted),
        `recover` asks systemd nothing else: nothing to roll back, nothing restarted."""
        self._judged_ok(world)
        world.systemd.shown = {"ActiveState": "activating", "Result": "exit-code"}
        before = len(world.systemd.calls)
        done = recover(world.node)
        assert [c for c in world.systemd.calls[before:] if c[0] != "show"] == []
        assert done.message == "nothing to roll back: the upgrade was judged ok and is completing"


def _crash_restart(world: World, restarts: int) -> None:
    """A start of the converged agent after systemd restarted it `restarts` times."""
    world.clock.advance(5)
    world.node.controller.fire("settle", restarts=restarts)


class TestCrashLoop:
    def test_a_crash_loop_is_one_history_entry_with_its_count(self, world: World) -> None:
        """Forty starts after crashes are one history entry (its count and first time), the
        journal does not grow, and status says "crash-looping: 40 restarts since T"."""
        world.installed("1.0.0")
        first = world.clock.now() + 5
        _crash_restart(world, 1)
        journal = world.paths.state_dir / "history.jsonl"
        lines = journal.read_bytes().count(b"\n")
        for n in range(2, 41):
            _crash_restart(world, n)
        assert journal.read_bytes().count(b"\n") == lines
        last = world.node.store.history()[-1]
        assert (last["trigger"], last["restarts"], last["first"]) == ("settle", 40, first)
        assert last["time"] == world.clock.now()
        st = status(world.node)
        assert st.crash_loop == {"restarts": 40, "since": first, "last": world.clock.now()}
        assert st.to_json()["crash_loop"] == st.crash_loop
        assert st.next.summary.startswith("crash-looping: 40 restarts since ")

    def test_one_restart_is_not_called_a_loop(self, world: World,
                                              capsys: pytest.CaptureFixture[str]) -> None:
        """After one restart, status and history say "restarted once after a crash", never
        crash loop; from the second on, "crash-looping: 2 restarts since"."""
        from agent_fsm.cli import render as cli_render
        from agent_fsm.cli import status_view as cli_status_view
        from agent_fsm.views.history import history

        world.installed("1.0.0")
        _crash_restart(world, 1)
        st = status(world.node)
        assert st.next.summary.startswith("restarted once after a crash, 0.0s ago;")
        cli_render.show(cli_status_view.status_view(st, diff=False))
        cli_render.show_history(history(world.node))
        shown = capsys.readouterr().out
        assert shown.count("restarted once after a crash") == 3, shown
        assert "crash loop" not in shown and "crash-looping" not in shown, shown
        _crash_restart(world, 2)
        assert status(world.node).next.summary.startswith("crash-looping: 2 restarts since ")

    def test_a_start_by_hand_ends_the_loop(self, world: World) -> None:
        """A start that follows no crash is an entry of its own, and the next crash begins a
        new loop: status no longer says crash-looping in between."""
        world.installed("1.0.0")
        for n in (1, 2, 3):
            _crash_restart(world, n)
        world.node.controller.fire("settle")
        assert status(world.node).crash_loop is None
        _crash_restart(world, 1)
        loops = [e.get("restarts") for e in world.node.store.history() if e["trigger"] == "settle"]
        assert loops[-3:] == [3, None, 1]

    def test_a_crash_long_after_the_last_is_a_new_loop(self, world: World) -> None:
        """A crash more than CRASH_LOOP_WINDOW after the loop's last restart starts a new
        entry, and status stops saying crash-looping once that long has passed."""
        world.installed("1.0.0")
        _crash_restart(world, 1)
        _crash_restart(world, 2)
        world.clock.advance(CRASH_LOOP_WINDOW)
        assert status(world.node).crash_loop is None
        _crash_restart(world, 3)
        assert [e.get("restarts") for e in world.node.store.history()][-2:] == [2, 1]

    def test_the_daemon_tells_a_start_after_a_crash_from_systemd(self, world: World,
                                                                 tmp_path: Path) -> None:
        """The daemon asks systemd how often it restarted the unit (NRestarts) and a start
        after crashes joins the loop; a failing `systemctl show` counts as no crash."""
        from agent_fsm.agent.daemon import Daemon

        world.installed("1.0.0")
        daemon = Daemon(world.node, notifier=None, waker=None)  # type: ignore[arg-type]
        world.systemd.shown = {"NRestarts": "3"}
        assert daemon.workload.automatic_restarts() == 3
        world.systemd.fail = {"show"}
        assert daemon.workload.automatic_restarts() == 0
