"""Crash at every point: a real process killed with SIGKILL at each effect boundary of each
transition, then restarted; the node converges and the invariants hold throughout.

The points are enumerated from the machine's definition, so a new effect is covered without
editing a list.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agent_fsm.machine.engine import FAILPOINT_ENV
from agent_fsm.upgrade.registry import load_definition
from tests.helpers import World, make_world
from tests.machine.test_machine import _args, _to
from tests.reliability.crash_child import KILL_AFTER_APPEND

DEFINITION = load_definition()
POINTS = [(t.trigger, t.sources[0], k) for t in DEFINITION.transitions
          for k in range(len(t.effects) + 1)]
ROOT = Path(__file__).resolve().parents[2]
COVERED: list[str] = []
APPENDED: list[str] = []  # the kills between the journal append and the state write


def _trail(world: World) -> list[tuple[int, str, str, str]]:
    """The history as the journal holds it (each transition once, numbered without a gap)."""
    return [(e["seq"], e["trigger"], e["from"], e["to"]) for e in world.node.store.history()]


def _end(world: World) -> dict[str, object]:
    doc = world.node.store.read()
    host = world.node.effectors
    sig = host.signal()
    return {
        "state": doc.state,
        "pending": doc.pending is not None,
        "outcome": None if doc.last_result is None else doc.last_result["outcome"],
        "signal": None if sig is None else (sig.from_version, sig.to_version),
        "gate": host.gate.is_open(),
        "selected": host.releases.selected(),
        "last_good": host.releases.last_good(),
        "assets": world.assets_on_disk(),
        "history": _trail(world),
    }


@pytest.fixture(scope="module")
def systemctl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stand-in for systemctl: the one process boundary faked here."""
    path = tmp_path_factory.mktemp("bin") / "systemctl"
    path.write_text("#!/bin/sh\necho \"$@\" >> \"$(dirname \"$0\")/calls\"\n"
                    # the version the in-process FakeSystemd reports: both render the same unit
                    "[ \"$1\" = --version ] && echo 'systemd 252 (252)'\nexit 0\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(("trigger", "source", "k"), POINTS,
                         ids=[f"{t}:{k}" for t, _, k in POINTS])
def test_sigkill_at_every_effect_boundary(tmp_path: Path, systemctl: Path, trigger: str,
                                          source: str, k: int) -> None:
    """Killed with SIGKILL before effect k of a transition: the state file stays valid, a pending
    upgrade's last-good assets stay on disk, and the next start ends where an uninterrupted run
    does."""
    reference = make_world(tmp_path / "ref")
    _to(source)(reference)
    reference.node.controller.fire(trigger, **_args(trigger, reference))

    world = make_world(tmp_path / "crash")
    _to(source)(world)
    args = _args(trigger, world)
    assets_before = world.assets_on_disk()
    proc = subprocess.run(
        [sys.executable, "-m", "tests.reliability.crash_child", str(world.root), str(systemctl), trigger,
         json.dumps(args)],
        cwd=ROOT, env={**os.environ, FAILPOINT_ENV: f"{trigger}:{k}"},
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    COVERED.append(f"{trigger}:{k}")

    crashed = world.reopen()
    doc = crashed.node.store.read()  # valid: raises if torn or damaged
    if crashed.node.effectors.signal() is not None and trigger not in ("install", "activate"):
        assert crashed.assets_on_disk() == assets_before, "a pending upgrade lost its assets"
    if DEFINITION.transition(trigger).effects:
        assert doc.pending is not None and doc.pending.trigger == trigger
        assert doc.pending.done == k
        crashed.node.controller.resume()
    else:  # nothing to resume: the transition did not happen, and is simply fired again
        assert doc.pending is None and doc.state == source
        crashed.node.controller.fire(trigger, **args)
    assert _end(crashed) == _end(reference)


@pytest.mark.parametrize("trigger", [t.trigger for t in DEFINITION.transitions])
def test_the_points_are_where_the_engine_stops(tmp_path: Path, trigger: str) -> None:
    """Each transition, fired for real, passes exactly the crash points enumerated above, in
    order: a boundary the engine adds, or one the list leaves out, is a crash never tested."""
    t = DEFINITION.transition(trigger)
    world = make_world(tmp_path / "node")
    _to(t.sources[0])(world)
    args = _args(trigger, world)
    passed: list[tuple[str, int]] = []
    world.node.controller.failpoint = lambda trig, k: passed.append((trig, k))
    world.node.controller.fire(trigger, **args)
    assert passed == [(trig, k) for trig, _, k in POINTS if trig == trigger]


# One of each kind: the journal's creation, effects owed, a result published, none owed.
APPENDS = ["install", "begin_upgrade", "complete", "settle"]


@pytest.mark.parametrize("trigger", APPENDS)
def test_sigkill_between_the_journal_and_the_state_write(tmp_path: Path, systemctl: Path,
                                                         trigger: str) -> None:
    """Killed after the history entry was appended but before the state file committed it:
    the entry is not shown, and the next start records the transition exactly once."""
    t = DEFINITION.transition(trigger)
    reference = make_world(tmp_path / "ref")
    _to(t.sources[0])(reference)
    reference.node.controller.fire(trigger, **_args(trigger, reference))

    world = make_world(tmp_path / "crash")
    _to(t.sources[0])(world)
    args = _args(trigger, world)
    before = _trail(world)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.reliability.crash_child", str(world.root), str(systemctl), trigger,
         json.dumps(args)],
        cwd=ROOT, env={**os.environ, KILL_AFTER_APPEND: "1"},
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    APPENDED.append(trigger)

    crashed = world.reopen()
    assert _trail(crashed) == before  # appended, not committed: not shown
    assert crashed.node.store.journal.path.read_bytes().count(b"\n") == len(before) + 1
    if t.effects:
        crashed.node.controller.resume()
    else:
        crashed.node.controller.fire(trigger, **args)
    assert _end(crashed) == _end(reference)
