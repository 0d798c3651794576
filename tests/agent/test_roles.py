"""Only the last-good's code runs the way back, and a start is the restart it owed: the
daemon of a given release, on real files, with systemctl faked."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_fsm.actions.recover import recover
from agent_fsm.agent.daemon import Daemon, Waker
from agent_fsm.errors import NotItsRole
from agent_fsm.node.config import Config, Judgment
from agent_fsm.system.notify import Notifier
from agent_fsm.upgrade.roles import Command
from agent_fsm.wiring import Node, open_node
from tests.helpers import Crash, World, crash_at, make_world


def _world(tmp_path: Path) -> World:
    config = Config(name="agent", judgment=Judgment(deadline_seconds=1, soak_seconds=0,
                                                    max_attempts=3, checks=(("true",),)))
    return make_world(tmp_path / "root", config)


def _as(world: World, command: Command, release: str) -> Node:
    """The node as a process of `command` started from `release` sees it."""
    return open_node(world.node.config, world.root, systemd=world.systemd,
                     publisher=world.publisher, clock=world.clock, command=command,
                     release=release)


def _stopped_by_restart(world: World, waker: Waker) -> None:
    """As systemd does: a restart of the agent unit stops this process (SIGTERM)."""
    def on_call(verb: str, unit: str) -> None:
        if verb == "restart" and unit == "agent.service":
            waker.stop = True

    world.systemd.on_call = on_call


def _files(world: World) -> tuple[bytes, bytes | None]:
    sig = world.paths.signal_file
    return world.paths.state_file.read_bytes(), sig.read_bytes() if sig.exists() else None


class TestTheCandidateNeverRunsTheWayBack:
    def test_candidate_started_in_recovering_hands_over_untouched(
            self, tmp_path: Path, waker: Waker) -> None:
        """The candidate's daemon, started before `recover` moved `selected` (the race of
        item 4), finds the node rolling back: it leaves the state and the signal byte for byte,
        restarts its unit so that the last-good's start fires `recovered`, and exits cleanly."""
        world = _world(tmp_path)
        world.installed("1.0.0")
        world.upgrading("2.0.0")
        world.node.controller.fire("recover")
        before = _files(world)
        _stopped_by_restart(world, waker)
        world.systemd.calls.clear()
        assert Daemon(_as(world, Command.daemon, "2.0.0"), Notifier(""), waker).startup()
        assert waker.stop  # it waited for the stop its restart brings
        assert _files(world) == before
        assert world.systemd.calls == [("restart", "agent.service")]
        # ... and the last-good's start finishes the way back.
        assert Daemon(_as(world, Command.daemon, "1.0.0"), Notifier(""), Waker()).startup()
        assert world.node.store.read().state == "converged"

    def test_candidate_never_finishes_an_interrupted_rollback(
            self, tmp_path: Path, waker: Waker) -> None:
        """A `recover` killed before it selected the last-good leaves it owed; the candidate's
        daemon, still selected, does not finish it: it starts the recovery unit (the
        last-good's `recover` finishes it) and exits 1, the state as it was."""
        world = _world(tmp_path)
        world.installed("1.0.0")
        world.upgrading("2.0.0")
        world.node.controller.failpoint = crash_at("recover", 2)
        with pytest.raises(Crash):
            world.node.controller.fire("recover")
        before = _files(world)
        world.systemd.calls.clear()
        assert not Daemon(_as(world, Command.daemon, "2.0.0"), Notifier(""), waker).startup()
        assert _files(world) == before
        assert world.systemd.calls == [("start", "agent-recovery.service")]
        assert world.node.releases.selected() == "2.0.0"

    def test_recover_run_from_the_candidate_release_is_refused(self, tmp_path: Path) -> None:
        """`agent-fsm recover` running the candidate's code (an operator's PATH during the
        upgrade) may not fire `recover`: it is refused, naming the roles, the state untouched."""
        world = _world(tmp_path)
        world.installed("1.0.0")
        world.upgrading("2.0.0")
        before = _files(world)
        with pytest.raises(NotItsRole) as err:
            recover(_as(world, Command.recover, "2.0.0"))
        assert "may not fire recover: it is the recovery's to run" in str(err.value)
        assert _files(world) == before

    def test_last_good_daemon_does_not_judge_the_candidate(
            self, tmp_path: Path, waker: Waker) -> None:
        """The last-good's daemon started while an upgrade is pending (its launcher resolved
        `selected` before the upgrade moved it) does not judge the candidate with its own code:
        it restarts its unit for the candidate's start, attempt not counted."""
        world = _world(tmp_path)
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world.node.controller.fire("begin_upgrade", release="2.0.0")
        before = _files(world)
        _stopped_by_restart(world, waker)
        assert Daemon(_as(world, Command.daemon, "1.0.0"), Notifier(""), waker).startup()
        assert _files(world) == before
        assert ("restart", "agent.service") in world.systemd.calls


    @pytest.mark.parametrize("k", [3, 6], ids=["after-clear-signal", "after-promote"])
    def test_candidate_finishes_its_complete_killed_late(
            self, tmp_path: Path, waker: Waker, k: int) -> None:
        """The candidate's daemon killed inside `complete` after it cleared the signal (and the
        upgrade with it), or after it promoted itself to last-good: its next start still
        finishes `complete`, so the node converges on it instead of handing over to a recovery
        that has nothing to do, for ever."""
        world = _world(tmp_path)
        world.installed("1.0.0")
        world.upgrading("2.0.0")
        world.node.controller.fire("judge_ok")
        world.node.controller.failpoint = crash_at("complete", k)
        with pytest.raises(Crash):
            world.node.controller.fire("complete")
        assert world.node.signal() is None
        assert Daemon(_as(world, Command.daemon, "2.0.0"), Notifier(""), waker).startup()
        assert world.node.store.read().state == "converged"
        assert world.node.releases.last_good() == "2.0.0"
        assert world.node.gate.is_open()


class TestAStartIsTheRestartItOwed:
    def test_upgrade_killed_before_its_restart_is_judged_once(
            self, tmp_path: Path, waker: Waker) -> None:
        """`agent-fsm upgrade` killed between its write-ahead and its restart, then a start of
        the unit running the candidate: the owed restart counts as done (no restart of its own
        start), the candidate is judged at its first attempt and converges, nothing marked bad."""
        world = _world(tmp_path)
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world.node.controller.failpoint = crash_at("begin_upgrade", 6)  # before restart_unit
        with pytest.raises(Crash):
            world.node.controller.fire("begin_upgrade", release="2.0.0")
        world.systemd.calls.clear()
        assert Daemon(_as(world, Command.daemon, "2.0.0"), Notifier(""), waker).startup()
        assert ("restart", "agent.service") not in world.systemd.calls
        doc = world.node.store.read()
        assert doc.state == "converged" and doc.last_result is not None
        assert doc.last_result["outcome"] == "ok"
        starts = [e for e in world.node.store.history(doc) if e["trigger"] == "candidate_started"]
        assert len(starts) == 1
        assert not world.paths.known_bad_file.exists()

    def test_upgrade_killed_before_selecting_is_abandoned_by_the_last_good(
            self, tmp_path: Path, waker: Waker) -> None:
        """Killed before it selected the candidate, the upgrade is abandoned by the last-good's
        start, not finished (the recovery its failure queued would roll back and mark a
        candidate that never ran): 1.0.0 stays selected, no restart, the gate opens."""
        world = _world(tmp_path)
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world.node.controller.failpoint = crash_at("begin_upgrade", 4)  # before select_release
        with pytest.raises(Crash):
            world.node.controller.fire("begin_upgrade", release="2.0.0")
        _stopped_by_restart(world, waker)
        world.systemd.calls.clear()
        assert Daemon(_as(world, Command.daemon, "1.0.0"), Notifier(""), waker).startup()
        assert ("restart", "agent.service") not in world.systemd.calls
        doc = world.node.store.read()
        assert (doc.state, doc.pending, world.node.releases.selected()) == (
            "converged", None, "1.0.0")
        assert world.node.signal() is None and world.node.gate.is_open()
        assert not world.paths.known_bad_file.exists()

    def test_rollback_killed_before_its_restart_is_finished_by_the_last_good(
            self, tmp_path: Path, waker: Waker) -> None:
        """`recover` killed before its restart: the last-good's start (by `Restart=`) counts the
        owed restart as done and finishes the way back in the same start."""
        world = _world(tmp_path)
        world.installed("1.0.0")
        world.upgrading("2.0.0")
        world.node.controller.failpoint = crash_at("recover", 4)
        with pytest.raises(Crash):
            world.node.controller.fire("recover")
        world.systemd.calls.clear()
        assert Daemon(_as(world, Command.daemon, "1.0.0"), Notifier(""), waker).startup()
        assert ("restart", "agent.service") not in world.systemd.calls
        assert world.node.store.read().state == "converged"
        assert world.node.signal() is None and world.node.gate.is_open()


NODE_PYTHON = Path("/usr/bin/python3")


@pytest.mark.skipif(not NODE_PYTHON.exists(), reason="no /usr/bin/python3 on this machine")
class TestRecoverHandsOver:
    def test_recover_from_the_candidate_release_runs_the_last_goods(
            self, tmp_path: Path) -> None:
        """`agent-fsm recover` run through the candidate's own `bin/agent-fsm` (what PATH finds
        during an upgrade) hands over to the last-good's `bin/agent-fsm`, which rolls back."""
        import subprocess

        from agent_fsm.actions.releases import packing
        from tests.helpers import env_with_stub_systemctl

        world = _world(tmp_path)
        for version in ("1.0.0", "2.0.0"):
            packing.add(packing.pack(version, tmp_path / "packs" / version), world.node)
        world.installed("1.0.0")
        world.node.controller.fire("begin_upgrade", release="2.0.0")
        cfg = tmp_path / "config.toml"
        cfg.write_text('name = "agent"\n[judgment]\ndeadline_seconds = 1\nsoak_seconds = 0\n'
                       'max_attempts = 3\nchecks = [["/bin/true"]]\n')
        launcher = world.node.releases.path("2.0.0") / "bin" / "agent-fsm"
        proc = subprocess.run([str(launcher), "--config", str(cfg), "--root", str(world.root),
                               "recover"], env=env_with_stub_systemctl(tmp_path),
                              capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr
        assert "handing over to the last-good's" in proc.stderr
        assert "releases/1.0.0/bin/agent-fsm" in proc.stderr
        assert "rolling back to last-good 1.0.0" in proc.stdout
        assert world.node.store.read().state == "recovering"
