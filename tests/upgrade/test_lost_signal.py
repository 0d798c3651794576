"""A lost signal: an upgrade the state file knows whose signal is gone, damaged, of a newer
schema, or cannot be written back. The last-good's start check refuses the candidate's start
and starts the recovery unit, `recover` rolls the upgrade back (saying the signal was lost), and
the last-good's start converges: no crash loop, no operator."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from agent_fsm.actions.recover import recover
from agent_fsm.agent.daemon import Daemon, Waker
from agent_fsm.agent.start_check import ALLOW, REFUSE, start_check
from agent_fsm.errors import Refused
from agent_fsm.node.config import Config, Judgment
from agent_fsm.node.records import known_bad
from agent_fsm.node.state.document_file import checksum
from agent_fsm.system.notify import Notifier
from agent_fsm.upgrade.registry import load_definition
from tests.helpers import Crash, World, crash_at, make_world
from tests.reliability.test_hostile import FailingDisk

ROOT = Path(__file__).resolve().parents[2]
RECOVERY = ("start", "agent-recovery.service")


def _gone(world: World) -> None:
    world.paths.signal_file.unlink()


def _damaged(world: World) -> None:
    world.paths.signal_file.write_text("{damaged")


def _newer(world: World) -> None:
    data = json.loads(world.paths.signal_file.read_bytes())
    data.pop("checksum")
    data["schema"] = 2
    data["checksum"] = checksum(data)
    world.paths.signal_file.write_text(json.dumps(data))


LOST: dict[str, Callable[[World], None]] = {"gone": _gone, "damaged": _damaged,
                                            "newer": _newer}


def _judging(world: World) -> World:
    """The candidate 2.0.0 being judged: its daemon counted an attempt."""
    return world.installed("1.0.0").upgrading("2.0.0")


def _judged_failed(world: World) -> World:
    _judging(world).node.controller.fire("judge_failed", reason="a check failed",
                                         reason_class="check_failed")
    return world


def _selected_not_begun(world: World) -> World:
    """`upgrade` killed after it selected its candidate, before its restart: owed."""
    world.installed("1.0.0")
    world.add_release("2.0.0")
    effects = load_definition().transition("begin_upgrade").effect_names
    world.node.controller.failpoint = crash_at("begin_upgrade", effects.index("reset_start_limit"))
    with pytest.raises(Crash):
        world.node.controller.fire("begin_upgrade", release="2.0.0")
    return world.reopen()


def _checked(tmp_path: Path, check: tuple[str, ...]) -> World:
    """A node whose judgment runs `check` (none if empty): 1 s deadline, no soak."""
    config = Config(name="agent", judgment=Judgment(
        deadline_seconds=1, soak_seconds=0, max_attempts=2, checks=(check,) if check else ()))
    return make_world(tmp_path / "root", config)


def _command(world: World, tmp_path: Path, command: str) -> tuple[
        subprocess.CompletedProcess[str], list[str]]:
    """Run `agent-fsm COMMAND` on the world's files, its systemctl a stub that records its
    arguments and succeeds: the process and what systemctl was asked."""
    config = tmp_path / "config.toml"
    config.write_text('name = "agent"\n[judgment]\ndeadline_seconds = 60\n'
                      'soak_seconds = 5\nmax_attempts = 3\n')
    bindir = tmp_path / "bin"
    bindir.mkdir()
    asked = tmp_path / "asked"
    asked.touch()
    (bindir / "systemctl").write_text(f'#!/bin/sh\necho "$@" >> {asked}\nexit 0\n')
    (bindir / "systemctl").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
    proc = subprocess.run(
        [sys.executable, "-m", "agent_fsm", "--config", str(config), "--root",
         str(world.root), command], cwd=ROOT, capture_output=True, text=True,
        env={**env, "PATH": f"{bindir}:{os.environ['PATH']}"}, timeout=60, check=False)
    return proc, asked.read_text().splitlines()


def _one_error_line(proc: subprocess.CompletedProcess[str], needle: str) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("<3>")]
    assert len(errors) == 1 and needle in errors[0], proc.stderr


KNOWN: dict[str, Callable[[World], World]] = {
    "candidate_running": _judging, "judged_failed": _judged_failed,
    "begin_upgrade owed": _selected_not_begun}


class TestStartCheck:
    @pytest.mark.parametrize("lost", LOST)
    @pytest.mark.parametrize("known", KNOWN)
    def test_a_start_whose_signal_is_lost_is_refused_and_starts_recovery(
            self, world: World, known: str, lost: str) -> None:
        """While the state file knows the upgrade and the candidate is selected, a start whose
        signal is gone, damaged or newer is refused and starts the recovery unit, each start
        again; once `recover` has rolled back, the last-good's start goes on."""
        world = KNOWN[known](world)
        LOST[lost](world)
        before = len(world.systemd.calls)
        assert [start_check(world.node, world.systemd) for _ in range(2)] == [REFUSE] * 2
        assert world.systemd.calls[before:] == [RECOVERY] * 2
        recover(world.node)
        assert world.node.releases.selected() == "1.0.0"
        assert start_check(world.node, world.systemd) == ALLOW

    def test_a_start_whose_count_cannot_be_written_is_refused_and_starts_recovery(
            self, world: World, monkeypatch: pytest.MonkeyPatch) -> None:
        """A read-only state dir at a candidate's start (the count cannot be written back)
        refuses the start and starts the recovery unit; the signal keeps its bytes."""
        _judging(world)
        before, calls = world.paths.signal_file.read_bytes(), len(world.systemd.calls)
        FailingDisk(monkeypatch, "write", 1, errno.EROFS)
        assert start_check(world.node, world.systemd) == REFUSE
        monkeypatch.undo()
        assert [c for c in world.systemd.calls[calls:] if c[0] != "show"] == [RECOVERY]
        assert world.paths.signal_file.read_bytes() == before

    def test_a_judged_ok_candidate_whose_complete_cleared_the_signal_starts(
            self, world: World) -> None:
        """A candidate judged ok whose `complete` was killed after it cleared the signal is
        started (its start finishes `complete`): no refusal, no recovery."""
        _judging(world).node.controller.fire("judge_ok")
        world.node.controller.failpoint = crash_at("complete", 3)
        with pytest.raises(Crash):
            world.node.controller.fire("complete")
        assert world.node.signal() is None and world.node.store.read().state == "judged_ok"
        before = len(world.systemd.calls)
        assert start_check(world.node, world.systemd) == ALLOW
        assert world.systemd.calls[before:] == []

    def test_the_start_check_command_exits_1_and_asks_systemctl_for_recovery(
            self, world: World, tmp_path: Path) -> None:
        """`agent-fsm start-check` (the agent unit's ExecStartPre=) exits 1 for a candidate
        whose signal is gone, having run `systemctl start` of the recovery unit, and says why
        in one error line naming the signal."""
        _judging(world)
        _gone(world)
        proc, asked = _command(world, tmp_path, "start-check")
        assert proc.returncode == 1, proc.stderr
        _one_error_line(proc, str(world.paths.signal_file))
        assert asked == ["start --no-block -- agent-recovery.service"]


class TestTheCandidatesDaemon:
    def test_a_candidate_whose_signal_is_gone_is_not_judged(self, tmp_path: Path,
                                                            waker: Waker) -> None:
        """The candidate's daemon started with its signal gone fires nothing, starts the
        recovery unit and fails: the candidate is neither judged nor counted."""
        world = _checked(tmp_path, ("true",))
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world.node.controller.fire("begin_upgrade", release="2.0.0")
        _gone(world)
        seq = world.node.store.read().seq
        assert not Daemon(world.node, Notifier(""), waker).startup()
        doc = world.node.store.read()
        assert (doc.state, doc.seq, doc.pending) == ("candidate_running", seq, None)
        assert RECOVERY in world.systemd.calls

    def test_a_check_that_deletes_the_signal_gets_the_candidate_no_verdict(
            self, tmp_path: Path, waker: Waker) -> None:
        """A candidate whose checks pass but delete its signal is not judged ok: its daemon
        starts the recovery unit and fails, the last-good's assets held, the gate shut."""
        signal_file = _checked(tmp_path, ()).paths.signal_file
        world = _checked(tmp_path, ("rm", "-f", str(signal_file)))
        world.installed("1.0.0")
        held = world.assets_on_disk()
        world.add_release("2.0.0")
        world.node.controller.fire("begin_upgrade", release="2.0.0")
        assert not Daemon(world.node, Notifier(""), waker).startup()
        doc = world.node.store.read()
        assert doc.state == "candidate_running" and world.node.releases.last_good() == "1.0.0"
        assert RECOVERY in world.systemd.calls
        assert world.assets_on_disk() == held and not world.node.gate.is_open()

    def test_the_daemon_command_exits_1_in_one_line(self, world: World, tmp_path: Path) -> None:
        """`agent-fsm daemon` of a candidate whose signal is gone exits 1 with one error line
        naming the signal, no traceback, having asked systemctl to start the recovery unit."""
        _judging(world)
        _gone(world)
        proc, asked = _command(world, tmp_path, "daemon")
        assert proc.returncode == 1, proc.stderr
        _one_error_line(proc, str(world.paths.signal_file))
        assert "start --no-block -- agent-recovery.service" in asked


class TestTheMachine:
    def test_judge_ok_is_refused_without_a_signal(self, world: World) -> None:
        """`judge_ok` is refused once the signal is gone: a verdict needs the signal its starts
        were counted in; the state stays `candidate_running` for the way back."""
        _judging(world)
        _gone(world)
        with pytest.raises(Refused, match="no upgrade signal exists"):
            world.node.controller.fire("judge_ok")
        assert world.node.store.read().state == "candidate_running"


class TestTheWayBack:
    @pytest.mark.parametrize("lost", LOST)
    def test_the_node_converges_on_the_last_good_saying_the_signal_was_lost(
            self, world: World, waker: Waker, monkeypatch: pytest.MonkeyPatch,
            lost: str) -> None:
        """A candidate whose signal is lost while it is judged: the recovery unit's `recover`
        rolls back, the last-good's start converges with the gate open, the result says the
        signal was lost, and the candidate (never judged) is not marked known bad."""
        _judging(world)
        LOST[lost](world)
        assert start_check(world.node, world.systemd) == REFUSE
        assert recover(world.node, by_unit=True).state == "recovering"
        assert start_check(world.node, world.systemd) == ALLOW
        assert Daemon(world.node, Notifier(""), waker).startup()
        doc = world.node.store.read()
        assert (doc.state, world.node.releases.selected(), world.node.signal()) == (
            "converged", "1.0.0", None)
        assert world.node.gate.is_open()
        result = doc.last_result or {}
        assert (result.get("to"), result.get("outcome")) == ("2.0.0", "rolled_back")
        assert "upgrade signal was lost" in str(result.get("reason")), result
        assert known_bad.read(world.paths.known_bad_file).marks == {}
