"""Disk faults on the way back: ENOSPC, EIO or EROFS at any write, fsync, rename or
symlink of a rollback (`recover`, then the last-good's `recovered`) is one error naming the path
and the fix, or is let pass where the definition says the effect may fail; the disk is never
left with a temporary file, and the next try (the recovery unit's, or the daemon's next start)
converges on the last-good."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from agent_fsm.actions.recover import recover
from agent_fsm.errors import AgentFsmError, DiskError
from tests.helpers import World, make_world
from tests.reliability.test_hostile import FailingDisk

FAULTS = [("write", errno.ENOSPC), ("fsync", errno.EIO), ("replace", errno.EROFS),
          ("symlink", errno.ENOSPC)]


def _judged_failed(root: Path) -> World:
    world = make_world(root).installed("1.0.0").upgrading("2.0.0")
    world.node.controller.fire("judge_failed", reason="a check failed",
                               reason_class="check_failed")
    return world


def _roll_back(world: World) -> None:
    """What the way back runs: the recovery unit's `recover`, then the last-good's daemon
    finishing the rollback (it resumes what is owed, then fires `recovered`)."""
    recover(world.node)
    doc = world.node.controller.resume()
    if doc.state == "recovering":
        world.node.controller.fire("recovered")


def _calls(tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> int:
    world = _judged_failed(tmp_path / "probe")
    counter = FailingDisk(monkeypatch, name, 10**9, errno.EIO)
    _roll_back(world)
    monkeypatch.undo()
    return counter.calls


@pytest.mark.parametrize(("name", "err"), FAULTS, ids=[n for n, _ in FAULTS])
def test_a_disk_fault_anywhere_on_the_way_back_is_one_error_and_the_next_try_converges(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, err: int) -> None:
    """At every call of one kind in a rollback, the fault is a DiskError naming a path below
    the node and what to do (or is let pass by an effect that may fail), no temporary file is
    left, and trying again with a working disk ends converged on the last-good."""
    total = _calls(tmp_path, name, monkeypatch)
    assert total >= 1  # the probe saw the way back make such calls
    raised = 0
    for n in range(1, total + 1):
        world = _judged_failed(tmp_path / f"{name}-{n}")
        FailingDisk(monkeypatch, name, n, err)  # fsync never retried: test_hostile.py
        try:
            _roll_back(world)
        except AgentFsmError as exc:
            raised += 1
            assert isinstance(exc, DiskError), (n, exc)
            words = str(exc)
            assert os.strerror(err) in words and str(world.root) in words, (n, words)
            assert "\n" not in words and ("run the command again" in words
                                          or "check it" in words), (n, words)
        finally:
            monkeypatch.undo()
        assert [p for p in world.root.rglob("*.tmp")] == [], n
        again = world.reopen()
        _roll_back(again)
        doc = again.node.store.read()
        assert (doc.state, doc.pending) == ("converged", None), n
        assert again.node.releases.selected() == again.node.releases.last_good() == "1.0.0", n
        assert again.node.signal() is None and again.node.gate.is_open(), n
    assert raised > 0  # a rollback cannot get past every one of them
