"""The daemon's startup on real files, with systemctl faked: what it does in each state."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_fsm.config import Config, Judgment
from agent_fsm.daemon import Daemon, Waker
from agent_fsm.notify import Notifier
from tests.helpers import World, make_world


@pytest.fixture
def waker() -> Iterator[Waker]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)}
    yield Waker()
    signal.set_wakeup_fd(-1)
    for s, h in saved.items():
        signal.signal(s, h)


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
        assert world.node.host.gate.is_open()
        assert world.assets_on_disk() == world.rendered("1.0.0")

    def test_healthy_candidate_is_judged_ok_and_converges(self, tmp_path: Path,
                                                           waker: Waker) -> None:
        """A candidate whose checks pass converges: its assets written, it is the last-good."""
        world = _world(tmp_path, (("true",),))
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world.node.controller.fire("begin_upgrade", release="2.0.0")
        assert Daemon(world.node, Notifier(""), waker).startup()
        assert world.node.store.read().state == "converged"
        assert world.node.host.releases.last_good() == "2.0.0"
        assert world.assets_on_disk() == world.rendered("2.0.0")
        assert world.node.host.gate.is_open() and world.node.host.signal() is None

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
        assert not world.node.host.gate.is_open() and world.node.host.signal() is not None

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
        assert world.node.host.signal() is None and world.node.host.gate.is_open()

    def test_not_installed_exits_non_zero(self, tmp_path: Path, waker: Waker) -> None:
        """A daemon started before any install says so and fails."""
        world = _world(tmp_path, ())
        assert not Daemon(world.node, Notifier(""), waker).startup()
