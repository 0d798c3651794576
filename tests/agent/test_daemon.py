"""The daemon's startup on real files, with systemctl faked: what it does in each state."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from pathlib import Path

import pytest

from agent_fsm.agent.daemon import Daemon, Waker
from agent_fsm.errors import ReleaseError
from agent_fsm.node.config import Config, Judgment
from agent_fsm.node.records import known_bad
from agent_fsm.node.releases import store as release_store
from agent_fsm.system.notify import Notifier
from tests.helpers import Crash, World, crash_at, env_with_stub_systemctl, make_world


def _world(tmp_path: Path, checks: tuple[tuple[str, ...], ...]) -> World:
    config = Config(name="agent", judgment=Judgment(deadline_seconds=1, soak_seconds=0,
                                                    max_attempts=2, checks=checks))
    return make_world(tmp_path / "root", config)


class TestStartup:
    def test_converged_start_converges_and_opens_gate(self, tmp_path: Path, waker: Waker) -> None:
        """Without a signal the daemon rewrites differing assets and opens the gate."""
        world = _world(tmp_path, ())
        world.add_release("1.0.0")
        world.node.controller.fire("install", release="1.0.0")
        world.paths.agent_unit.write_text("# drifted\n")
        assert Daemon(world.node, Notifier(""), waker).startup()
        assert world.node.effectors.gate.is_open()
        assert world.assets_on_disk() == world.rendered("1.0.0")

    @pytest.mark.parametrize("cut", range(3))  # before close_gate, write_signal, select_release
    def test_last_good_start_abandons_an_upgrade_cut_before_its_candidate_started(
            self, tmp_path: Path, waker: Waker, cut: int) -> None:
        """The last-good's start after an `upgrade` cut past its write-ahead abandons it rather
        than finish it: no signal, 1.0.0 still selected, 2.0.0 not known bad, the gate open."""
        world = _world(tmp_path, (("true",),))
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world.node.controller.failpoint = crash_at("begin_upgrade", cut)
        with pytest.raises(Crash):
            world.node.controller.fire("begin_upgrade", release="2.0.0")
        world = world.reopen()
        world.systemd.calls.clear()
        assert Daemon(world.node, Notifier(""), waker).startup()
        doc = world.node.store.read()
        assert (doc.state, doc.pending, doc.upgrade) == ("converged", None, None)
        assert world.node.releases.selected() == "1.0.0" and world.node.signal() is None
        assert known_bad.read(world.paths.known_bad_file).marks == {}
        assert world.node.effectors.gate.is_open()
        assert ("restart", "agent.service") not in world.systemd.calls
        assert [e["trigger"] for e in world.node.store.history(doc)[-3:]] == [
            "begin_upgrade", "abandon_upgrade", "settle"]

    def test_healthy_candidate_is_judged_ok_and_converges(self, tmp_path: Path,
                                                           waker: Waker) -> None:
        """A candidate whose checks pass converges: its assets written, it is the last-good."""
        world = _world(tmp_path, (("true",),))
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world.node.controller.fire("begin_upgrade", release="2.0.0")
        assert Daemon(world.node, Notifier(""), waker).startup()
        assert world.node.store.read().state == "converged"
        assert world.node.effectors.releases.last_good() == "2.0.0"
        assert world.assets_on_disk() == world.rendered("2.0.0")
        assert world.node.effectors.gate.is_open() and world.node.effectors.signal() is None

    def test_failing_candidate_starts_recovery_and_holds(self, tmp_path: Path,
                                                          waker: Waker) -> None:
        """A candidate whose check fails is judged failed: recovery starts, assets held, gate shut."""
        world = _world(tmp_path, (("false",),))
        world.installed("1.0.0")
        before = world.assets_on_disk()
        world.add_release("2.0.0")
        world.node.controller.fire("begin_upgrade", release="2.0.0")
        assert not Daemon(world.node, Notifier(""), waker).startup()
        assert world.node.store.read().state == "judged_failed"
        assert ("start", "agent-recovery.service") in world.systemd.calls
        assert world.assets_on_disk() == before
        assert not world.node.effectors.gate.is_open() and world.node.effectors.signal() is not None

    def test_last_good_back_after_recovery_clears_and_opens(self, tmp_path: Path,
                                                            waker: Waker) -> None:
        """The last-good's daemon, started by recovery, clears the signal and opens the gate."""
        world = _world(tmp_path, ())
        world.installed("1.0.0")
        world.upgrading("2.0.0")
        world.node.controller.fire("recover")
        assert Daemon(world.node, Notifier(""), waker).startup()
        doc = world.node.store.read()
        assert doc.state == "converged" and doc.last_result["outcome"] == "rolled_back"  # type: ignore[index]
        assert world.node.effectors.signal() is None and world.node.effectors.gate.is_open()

    def test_not_installed_exits_non_zero(self, tmp_path: Path, waker: Waker) -> None:
        """A daemon started before any install says so and fails."""
        world = _world(tmp_path, ())
        assert not Daemon(world.node, Notifier(""), waker).startup()

    def test_not_installed_starts_no_recovery(self, tmp_path: Path, waker: Waker) -> None:
        """A daemon started before any install leaves systemd alone: nothing to roll back to."""
        world = _world(tmp_path, ())
        assert not Daemon(world.node, Notifier(""), waker).startup()
        assert world.systemd.calls == []

    def test_a_start_after_a_failed_judgment_starts_recovery(self, tmp_path: Path,
                                                             waker: Waker) -> None:
        """A daemon started again while the candidate is judged failed starts the recovery unit
        and fails, keeping the signal and the gate shut."""
        world = _world(tmp_path, ())
        world.installed("1.0.0")
        world.upgrading("2.0.0")
        world.node.controller.fire("judge_failed", reason="check failed")
        world.systemd.calls.clear()
        assert not Daemon(world.node, Notifier(""), waker).startup()
        assert world.systemd.calls == [("start", "agent-recovery.service")]
        assert world.node.store.read().state == "judged_failed"
        assert not world.node.effectors.gate.is_open() and world.node.effectors.signal() is not None


class TestStopDuringJudgment:
    def test_a_stop_while_judging_is_no_verdict(self, tmp_path: Path, waker: Waker) -> None:
        """SIGTERM (a `systemctl stop`, a reboot) while the candidate is judged keeps the
        signal, records no result and no known-bad mark, starts no recovery; the next start
        judges it again, one more attempt counted, and converges."""
        import os

        world = _world(tmp_path, (("sh", "-c", f"kill -TERM {os.getpid()}"),))
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world.node.controller.fire("begin_upgrade", release="2.0.0")
        world.systemd.calls.clear()
        assert Daemon(world.node, Notifier(""), waker).startup()
        assert waker.stop
        doc = world.node.store.read()
        sig = world.node.effectors.signal()
        assert doc.state == "candidate_running" and sig is not None and sig.attempt == 1
        assert doc.last_result is None and world.publisher.recorded == []
        assert not world.paths.known_bad_file.exists()
        assert world.systemd.calls == []
        # The next start (after the reboot), with a check that passes:
        again = make_world(world.root, world.node.config._replace(judgment=Judgment(
            deadline_seconds=1, soak_seconds=0, max_attempts=2, checks=(("true",),))),
            world.systemd, world.publisher, world.clock)
        assert Daemon(again.node, Notifier(""), Waker()).startup()
        doc = again.node.store.read()
        assert doc.state == "converged" and doc.last_result["outcome"] == "ok"  # type: ignore[index]
        starts = [e for e in again.node.store.history(doc) if e["trigger"] == "candidate_started"]
        assert len(starts) == 2


class TestStopping:
    def test_workload_sigterm_then_stop_is_a_clean_exit(self, tmp_path: Path) -> None:
        """On a stop systemd signals the workload and the daemon: the workload dying of SIGTERM
        first is still a clean stop (exit 0), so recovery is not started."""
        import os
        import subprocess
        import sys
        import time

        world = _world(tmp_path, ())
        release = world.add_release("1.0.0")
        (release / "release.toml").write_text('version = "1.0.0"\nworkload = ["sleep", "60"]\n')
        world.record_digest("1.0.0")
        world.node.controller.fire("install", release="1.0.0")
        cfg = tmp_path / "config.toml"
        cfg.write_text('name = "agent"\n[judgment]\ndeadline_seconds = 1\nsoak_seconds = 0\n'
                       'max_attempts = 2\n')
        env = env_with_stub_systemctl(tmp_path)
        daemon = subprocess.Popen([sys.executable, "-m", "agent_fsm", "--config", str(cfg),
                                   "--root", str(world.root), "daemon"], env=env,
                                  stderr=subprocess.PIPE, text=True)
        try:
            for _ in range(200):
                kids = Path(f"/proc/{daemon.pid}/task/{daemon.pid}/children").read_text().split()
                if kids and world.node.effectors.gate.is_open():
                    break
                time.sleep(0.05)
            assert kids, "the workload did not start"
            os.kill(int(kids[0]), signal.SIGTERM)
            time.sleep(0.3)
            daemon.send_signal(signal.SIGTERM)
            code = daemon.wait(timeout=30)
        finally:
            daemon.kill()
        assert code == 0, daemon.stderr.read() if daemon.stderr else ""


    def test_a_stop_while_waiting_for_the_writers_lock_is_heard(self, tmp_path: Path) -> None:
        """A daemon that waits for the writers' lock another process holds stops on SIGTERM at
        once (exit 0, nothing written), not after the lock's 30 s timeout, when systemd's stop
        timeout would kill it."""
        import fcntl
        import os
        import subprocess
        import sys
        import time

        world = _world(tmp_path, ())
        world.add_release("1.0.0")
        world.node.controller.fire("install", release="1.0.0")
        cfg = tmp_path / "config.toml"
        cfg.write_text('name = "agent"\n')
        state_before = world.paths.state_file.read_bytes()
        fd = os.open(world.node.store.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held as another agent-fsm's transition holds it
            daemon = subprocess.Popen([sys.executable, "-m", "agent_fsm", "--config", str(cfg),
                                       "--root", str(world.root), "daemon"],
                                      env=env_with_stub_systemctl(tmp_path),
                                      stderr=subprocess.PIPE, text=True)
            try:
                # Once it handles SIGTERM (a caught signal, /proc's SigCgt), it is the daemon's
                # to hear, wherever the daemon is in its start: the lock comes first in it.
                end = time.monotonic() + 60
                while not _catches(daemon.pid, signal.SIGTERM) and time.monotonic() < end:
                    assert daemon.poll() is None, daemon.stderr.read() if daemon.stderr else ""
                    time.sleep(0.02)
                daemon.send_signal(signal.SIGTERM)
                try:
                    code = daemon.wait(timeout=15)  # well under the lock's 30 s
                except subprocess.TimeoutExpired:
                    pytest.fail("the daemon did not stop on SIGTERM while it waited for the "
                                "writers' lock")
                err = daemon.stderr.read() if daemon.stderr else ""
            finally:
                daemon.kill()
                daemon.wait()
        finally:
            os.close(fd)
        assert code == 0, err
        assert "stopping on request" in err and "Traceback" not in err, err
        assert world.paths.state_file.read_bytes() == state_before


def _catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler for `signum` (its SigCgt mask in /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


class TestProtocol:
    def test_notify_sequence_watchdog_and_journal_prefixes(self, tmp_path: Path) -> None:
        """A real daemon process tells systemd its STATUS at each step, READY=1 only once the
        gate is open, WATCHDOG=1 when asked to, STOPPING=1 on SIGTERM, exits 0, and every log
        line carries a <N> priority prefix."""
        import re
        import socket
        import subprocess
        import sys

        world = _world(tmp_path, ())
        world.add_release("1.0.0")
        world.node.controller.fire("install", release="1.0.0")
        cfg = tmp_path / "config.toml"
        cfg.write_text('name = "agent"\n')
        address = str(tmp_path / "notify.sock")
        gate = world.node.effectors.gate
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(address)
            sock.settimeout(20)
            env = {**env_with_stub_systemctl(tmp_path), "NOTIFY_SOCKET": address,
                   "WATCHDOG_USEC": "400000"}
            daemon = subprocess.Popen([sys.executable, "-m", "agent_fsm", "--config", str(cfg),
                                       "--root", str(world.root), "daemon"], env=env,
                                      stderr=subprocess.PIPE, text=True)
            try:
                messages: list[str] = []
                gate_at_ready = None
                while sum(m == "WATCHDOG=1" for m in messages) < 2:
                    msg = sock.recv(4096).decode()
                    if msg.startswith("READY=1"):
                        gate_at_ready = gate.is_open()
                    messages.append(msg)
                daemon.send_signal(signal.SIGTERM)
                messages.append(sock.recv(4096).decode())
                code = daemon.wait(timeout=20)
            finally:
                daemon.kill()
            stderr = daemon.stderr.read() if daemon.stderr else ""
        assert code == 0, stderr
        assert messages[0].startswith("STATUS=")
        ready = next(i for i, m in enumerate(messages) if m.startswith("READY=1"))
        assert gate_at_ready is True
        assert all(m == "WATCHDOG=1" for m in messages[ready + 1:-1])
        assert messages[-1] == "STOPPING=1\nSTATUS=stopping"
        assert stderr.strip() and all(re.match(r"^<[0-7]>", line) for line in stderr.splitlines())


class TestOneCheckPerStart:
    def test_a_start_checks_the_release_it_renders_and_runs_once(
            self, tmp_path: Path, waker: Waker, monkeypatch: pytest.MonkeyPatch) -> None:
        """A converged start, and the last-good's start after a rollback, check the selected
        release against its digest once for both rendering its assets and starting its
        workload (each check walks the whole release)."""
        checks: list[str] = []
        real = release_store.check

        def counted(releases_dir: Path, version: str, hashed: object = None) -> object:
            checks.append(version)
            return real(releases_dir, version, hashed)  # type: ignore[arg-type]

        world = _world(tmp_path, ())
        world.installed("1.0.0")
        world.upgrading("2.0.0")
        world.node.controller.fire("judge_failed", reason="check failed")
        world.node.controller.fire("recover")
        monkeypatch.setattr(release_store, "check", counted)
        for state in ("recovering", "converged"):
            assert world.node.store.read().state == state
            checks.clear()
            assert Daemon(world.node, Notifier(""), waker).startup()
            assert checks == ["1.0.0"]

    def test_the_release_is_checked_again_after_the_start(self, tmp_path: Path,
                                                          waker: Waker) -> None:
        """The single check is the start's: a release changed once the daemon is up is refused
        at its next use."""
        world = _world(tmp_path, ())
        world.installed("1.0.0")
        assert Daemon(world.node, Notifier(""), waker).startup()
        (world.paths.releases_dir / "1.0.0" / "assets" / "agent.service").write_text("# changed\n")
        with pytest.raises(ReleaseError, match="is not what was stored"):
            world.node.releases.manifest("1.0.0")


class TestFreeMemory:
    def test_no_trim_call_is_no_failure(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Where the C library has no `malloc_trim` (not glibc) or cannot be opened, the daemon
        keeps its free heap and serves on: handing memory back never fails a start."""
        import ctypes

        from agent_fsm.agent import runtime

        class NoTrim:
            def __init__(self, _name: object) -> None:
                pass

        def unloadable(_name: object) -> None:
            raise OSError("no such library")

        for cdll in (NoTrim, unloadable):
            monkeypatch.setattr(ctypes, "CDLL", cdll)
            runtime.return_free_memory()


class TestCrashLoop:
    @pytest.mark.parametrize(("restarts", "reset"), [("4", True), ("0", False)])
    def test_a_stable_run_after_crashes_resets_the_restart_count(
            self, tmp_path: Path, waker: Waker, restarts: str, reset: bool) -> None:
        """A converged agent that systemd restarted after crashes, once up `stable_after`
        seconds, resets its unit's restart count (`reset-failed`), so the next crash waits the
        shortest delay again; a start that followed no crash resets nothing."""
        import os
        import threading

        world = _world(tmp_path, ())
        world.add_release("1.0.0")
        world.node.controller.fire("install", release="1.0.0")
        world.systemd.shown = {"NRestarts": restarts}
        daemon = Daemon(world.node, Notifier(""), waker)
        daemon.workload.stable_after = 0.2
        before = len(world.systemd.calls)
        stop = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGTERM))
        stop.start()
        try:
            assert daemon.run() == 0
        finally:
            stop.cancel()
        assert (("reset-failed", "agent.service") in world.systemd.calls[before:]) == reset


class TestDeadCommand:
    """The serving daemon and an operator's command that died half-way (docs/operations.md)."""

    @staticmethod
    def _killed(world: World, trigger: str, at: int, **args: object) -> World:
        """Run an operator's `trigger`, killed before its effect `at` (the lock goes with it,
        as with a process's descriptors); the node as the next process opens it."""
        world.node.controller.failpoint = crash_at(trigger, at)
        with pytest.raises(Crash):
            world.node.controller.fire(trigger, **args)
        world = world.reopen()
        world.systemd.calls.clear()
        return world

    @staticmethod
    def _serving(world: World) -> tuple[Daemon, subprocess.Popen[bytes]]:
        """The daemon serving 1.0.0 with its workload (a real process) running."""
        daemon = Daemon(world.node, Notifier(""), Waker())
        daemon.workload.start("1.0.0")
        assert daemon.workload.process is not None
        world.systemd.calls.clear()  # the workload's start asked systemd for its restarts
        return daemon, daemon.workload.process

    @staticmethod
    def _with_workload(world: World) -> None:
        (world.paths.releases_dir / "1.0.0" / "release.toml").write_text(
            'version = "1.0.0"\nworkload = ["sleep", "60"]\n')
        world.record_digest("1.0.0")

    def test_an_upgrade_killed_after_its_signal_is_abandoned_in_place(
            self, tmp_path: Path) -> None:
        """`upgrade` killed after it wrote its signal (gate shut, the candidate not selected):
        the serving daemon abandons it itself, with no restart and its workload running
        throughout: 1.0.0 selected, no signal, nothing known bad, the gate open."""
        world = _world(tmp_path, (("true",),))
        world.add_release("1.0.0")
        self._with_workload(world)
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world = self._killed(world, "begin_upgrade", 4, release="2.0.0")
        assert not world.node.effectors.gate.is_open() and world.node.signal() is not None
        daemon, workload = self._serving(world)
        try:
            assert daemon.dead_command.finish()
            assert ("restart", "agent.service") not in world.systemd.calls
            doc = world.node.store.read()
            assert (doc.state, doc.pending, world.node.signal()) == ("converged", None, None)
            assert world.node.releases.selected() == "1.0.0"
            assert known_bad.read(world.paths.known_bad_file).marks == {}
            assert world.node.effectors.gate.is_open()
            assert daemon.workload.process is workload and workload.poll() is None
            assert [e["trigger"] for e in world.node.store.history()][-2:] == [
                "abandon_upgrade", "settle"]
        finally:
            daemon.workload.stop()

    def test_a_full_disk_leaves_the_workload_running_and_is_tried_again(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """`upgrade` cut before its signal by a full disk (exit 1, `begin_upgrade` owed): while
        the disk stays full the serving daemon's looks fail, restart nothing and never exit,
        its workload running; once space is freed the next look abandons the upgrade and opens
        the gate."""
        import errno
        import os

        world = _world(tmp_path, ())
        world.add_release("1.0.0")
        self._with_workload(world)
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world = self._killed(world, "begin_upgrade", 3, release="2.0.0")  # as at write_signal
        daemon, workload = self._serving(world)
        state_dir = world.paths.state_file.parent
        real = os.write

        def full(fd: int, data: bytes) -> int:
            if Path(os.readlink(f"/proc/self/fd/{fd}")).parent == state_dir:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(fd, data)

        try:
            with monkeypatch.context() as m:
                m.setattr(os, "write", full)
                assert not daemon.dead_command.finish()
                assert not daemon.dead_command.finish()  # tried again, the file unchanged
            assert world.systemd.calls == []
            assert not world.node.effectors.gate.is_open()
            assert workload.poll() is None
            assert daemon.dead_command.finish()
            assert world.systemd.calls.count(("restart", "agent.service")) == 0
            assert world.node.effectors.gate.is_open() and world.node.signal() is None
            assert world.node.store.read().pending is None
            assert daemon.workload.process is workload and workload.poll() is None
        finally:
            daemon.workload.stop()

    def test_a_failure_after_the_gate_opened_shuts_it_until_done(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A full disk at the record of the in-place `settle`, after its `open_gate`: the gate
        is shut again while `settle` is owed (as a failed start leaves it), and the next look
        finishes it and opens the gate."""
        from agent_fsm.errors import DiskError

        world = _world(tmp_path, ())
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world = self._killed(world, "begin_upgrade", 4, release="2.0.0")
        daemon = Daemon(world.node, Notifier(""), Waker())
        journal = world.node.store.journal
        append = journal.append

        def full_at_settle(entry: dict[str, object], limit: int) -> None:
            if entry["trigger"] == "settle":
                raise DiskError("could not append to the history journal: No space left")
            append(entry, limit)

        with monkeypatch.context() as m:
            m.setattr(journal, "append", full_at_settle)
            assert not daemon.dead_command.finish()
        assert world.node.store.read().pending.trigger == "settle"  # type: ignore[union-attr]
        assert not world.node.effectors.gate.is_open()
        assert daemon.dead_command.finish()
        assert world.node.store.read().pending is None and world.node.effectors.gate.is_open()

    def test_a_signal_the_state_file_does_not_know_is_rolled_back_in_place(
            self, tmp_path: Path) -> None:
        """A signal beside the serving last-good while the state file knows no upgrade (put
        back from a backup): the daemon's look rolls it back itself (`orphaned_signal`, then
        `recovered`), no restart, the workload running: no signal, the gate open, 2.0.0 not
        marked known bad."""
        world = _world(tmp_path, ())
        world.add_release("1.0.0")
        self._with_workload(world)
        world.installed("1.0.0")
        backup = world.paths.state_file.read_bytes()
        world.upgrading("2.0.0")
        world.paths.state_file.write_bytes(backup)  # restored from before the upgrade
        world.node.releases.select("1.0.0")  # the candidate's start never came
        world = world.reopen()
        world.systemd.calls.clear()
        daemon, workload = self._serving(world)
        try:
            assert daemon.dead_command.finish()
            assert ("restart", "agent.service") not in world.systemd.calls
            doc = world.node.store.read()
            assert (doc.state, doc.pending, world.node.signal()) == ("converged", None, None)
            assert world.node.releases.selected() == "1.0.0"
            assert known_bad.read(world.paths.known_bad_file).marks == {}
            assert world.node.effectors.gate.is_open()
            assert workload.poll() is None
            assert [e["trigger"] for e in world.node.store.history()][-2:] == [
                "orphaned_signal", "recovered"]
        finally:
            daemon.workload.stop()

    def test_an_upgrade_killed_after_it_selected_is_finished_by_the_start_it_restarts(
            self, tmp_path: Path, waker: Waker) -> None:
        """`upgrade` killed after it selected its candidate: another release must start, so the
        serving daemon restarts its unit, touching nothing, and that start judges 2.0.0."""
        world = _world(tmp_path, (("true",),))
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world = self._killed(world, "begin_upgrade", 5, release="2.0.0")
        assert Daemon(world.node, Notifier(""), waker).dead_command.finish()
        assert world.systemd.calls == [("restart", "agent.service")]
        assert world.node.store.read().pending.trigger == "begin_upgrade"  # type: ignore[union-attr]
        assert world.node.releases.selected() == "2.0.0"

    def test_an_install_killed_half_way_is_finished_by_the_start_it_restarts(
            self, tmp_path: Path, waker: Waker) -> None:
        """`install --version 2.0.0` killed after it selected and promoted 2.0.0: the serving
        daemon restarts its unit and that start finishes the install: 2.0.0 selected and
        last-good, its assets on disk, the gate open."""
        world = _world(tmp_path, ())
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world = self._killed(world, "install", 3, release="2.0.0")
        assert Daemon(world.node, Notifier(""), waker).dead_command.finish()
        assert ("restart", "agent.service") in world.systemd.calls
        started = world.reopen()
        assert Daemon(started.node, Notifier(""), waker).startup()
        assert started.node.store.read().pending is None
        assert (started.node.releases.selected(), started.node.releases.last_good()) == (
            "2.0.0", "2.0.0")
        assert started.assets_on_disk() == started.rendered("2.0.0")
        assert started.node.effectors.gate.is_open()

    def test_a_live_command_holding_the_lock_is_left_alone(
            self, tmp_path: Path, waker: Waker, caplog: pytest.LogCaptureFixture) -> None:
        """While another process holds the writers' lock (a slow command still running its
        effects), the daemon neither waits for it nor touches anything; once the lock is let
        go with the transition still owed, it abandons the upgrade in place."""
        import fcntl
        import os

        world = _world(tmp_path, ())
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world = self._killed(world, "begin_upgrade", 4, release="2.0.0")
        daemon = Daemon(world.node, Notifier(""), waker)
        fd = os.open(world.node.store.lock_path, os.O_RDWR)
        before = world.node.store.path.read_bytes()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # as filelock takes it, on a descriptor of its own
            caplog.clear()
            assert not daemon.dead_command.finish()
            assert world.systemd.calls == []
            assert world.node.store.path.read_bytes() == before
            assert world.node.signal() is not None
            # It never tried (nor waited for the lock): nothing failed, nothing to log.
            assert [r.message for r in caplog.records if r.levelname == "ERROR"] == []
        finally:
            os.close(fd)
        assert daemon.dead_command.finish()
        assert world.node.signal() is None and world.node.effectors.gate.is_open()
        assert ("restart", "agent.service") not in world.systemd.calls

    def test_a_transition_of_the_way_back_left_owed_is_not_its_to_act_on(
            self, tmp_path: Path, waker: Waker) -> None:
        """`recover` killed half-way leaves the way back owed: that is the recovery's and the
        last-good's to finish, so the serving daemon restarts nothing."""
        world = _world(tmp_path, ())
        world.installed("1.0.0")
        world.upgrading("2.0.0")
        world = self._killed(world, "recover", 2)
        assert not Daemon(world.node, Notifier(""), waker).dead_command.finish()
        assert world.systemd.calls == []

    def test_an_install_told_not_to_start_is_left_to_its_operator(
            self, tmp_path: Path, waker: Waker) -> None:
        """`install --no-start` killed half-way: its operator asked for no restart, so the
        serving daemon restarts nothing (the next start or command finishes it)."""
        world = _world(tmp_path, ())
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world = self._killed(world, "install", 3, release="2.0.0", no_start=True)
        assert not Daemon(world.node, Notifier(""), waker).dead_command.finish()
        assert world.systemd.calls == []

    def test_nothing_owed_restarts_nothing(self, tmp_path: Path, waker: Waker) -> None:
        """A converged node with nothing owed: the daemon's looks restart nothing."""
        world = _world(tmp_path, ())
        world.installed("1.0.0")
        world.systemd.calls.clear()
        daemon = Daemon(world.node, Notifier(""), waker)
        assert not daemon.dead_command.finish() and not daemon.dead_command.finish()
        assert world.systemd.calls == []

    def test_a_failing_restart_is_tried_again_and_a_queued_one_not_repeated(
            self, tmp_path: Path, waker: Waker) -> None:
        """A `systemctl restart` that fails is asked again at the next look; one that was
        queued is not asked again while its stop is on the way."""
        world = _world(tmp_path, ())
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world = self._killed(world, "activate", 2, release="2.0.0")
        daemon = Daemon(world.node, Notifier(""), waker)
        world.systemd.fail = {"restart"}
        assert not daemon.dead_command.finish()
        world.systemd.fail = set()
        assert daemon.dead_command.finish()
        assert not daemon.dead_command.finish()
        assert world.systemd.calls == [("restart", "agent.service")]

    def test_the_serving_loop_looks_without_a_watchdog(
            self, tmp_path: Path, waker: Waker, monkeypatch: pytest.MonkeyPatch) -> None:
        """A daemon serving with no watchdog still wakes to look: an `upgrade` killed while it
        serves (another process's, in a thread here) gets its unit restarted within the
        look's interval, before any stop."""
        import os
        import threading

        from agent_fsm.agent import daemon as daemon_mod

        monkeypatch.delenv("WATCHDOG_USEC", raising=False)
        monkeypatch.setattr(daemon_mod, "OWED_CHECK_SECONDS", 0.2)
        world = _world(tmp_path, ())
        world.installed("1.0.0")
        world.add_release("2.0.0")
        operator = world.reopen()
        daemon = Daemon(world.node, Notifier(""), waker)
        world.systemd.calls.clear()  # the install's own restart

        def upgrade_killed() -> None:
            operator.node.controller.failpoint = crash_at("begin_upgrade", 5)
            with contextlib.suppress(Crash):
                operator.node.controller.fire("begin_upgrade", release="2.0.0")

        command = threading.Timer(0.3, upgrade_killed)
        stop = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGTERM))
        command.start()
        stop.start()
        try:
            assert daemon.run() == 0
        finally:
            command.cancel()
            stop.cancel()
        assert world.systemd.calls.count(("restart", "agent.service")) == 1

    def test_an_idle_daemon_wakes_for_nothing(
            self, tmp_path: Path, waker: Waker, monkeypatch: pytest.MonkeyPatch) -> None:
        """A daemon serving with no watchdog and nothing to do, after its first look, sleeps
        until something happens: no wait has a timeout, and a stop is the only wake."""
        import os
        import threading

        from agent_fsm.agent import daemon as daemon_mod

        monkeypatch.delenv("WATCHDOG_USEC", raising=False)
        monkeypatch.setattr(daemon_mod, "OWED_CHECK_SECONDS", 0.1)
        world = _world(tmp_path, ())
        world.installed("1.0.0")
        daemon = Daemon(world.node, Notifier(""), waker)
        timeouts: list[float | None] = []
        sleep = waker.wait

        def counted(timeout: float | None, also: int | None = None) -> None:
            timeouts.append(timeout)
            sleep(timeout, also)

        monkeypatch.setattr(waker, "wait", counted)
        stop = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGTERM))
        stop.start()
        try:
            assert daemon.run() == 0
        finally:
            stop.cancel()
        assert len(timeouts) == 2 and timeouts[1] is None  # the first look's, then the stop's
