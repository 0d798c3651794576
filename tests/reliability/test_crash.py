"""A crash between any two effects of a transition is resumed on the next start to the same end."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_fsm.upgrade.registry import load_definition
from tests.helpers import World, make_world
from tests.machine.test_machine import _args, _to

DEFINITION = load_definition()
POINTS = [
    (t.trigger, t.sources[0], k)
    for t in DEFINITION.transitions
    for k in range(len(t.effects) + 1)
]


class Crash(BaseException):
    """Stands for the process dying: nothing below catches a BaseException."""


def _snapshot(world: World) -> dict[str, object]:
    doc = world.node.store.read()
    host = world.node.effectors
    return {
        "state": doc.state,
        "pending": doc.pending,
        "upgrade": doc.upgrade,
        "last_result": None if doc.last_result is None else {
            k: v for k, v in doc.last_result.items() if k != "time"},
        "signal": host.signal(),
        "gate": host.gate.is_open(),
        "selected": host.releases.selected(),
        "last_good": host.releases.last_good(),
        "assets": world.assets_on_disk(),
    }


@pytest.mark.parametrize(("trigger", "source", "k"), POINTS, ids=[f"{t}:{k}" for t, _, k in POINTS])
def test_crash_before_effect_k_resumes_to_same_end(tmp_path: Path, trigger: str, source: str,
                                                    k: int) -> None:
    """Killed just before effect k (or before the final record), the next start finishes the
    transition: the host ends exactly as after an uninterrupted run."""
    reference = make_world(tmp_path / "ref")
    _to(source)(reference)
    reference.node.controller.fire(trigger, **_args(trigger, reference))

    world = make_world(tmp_path / "crash")
    _to(source)(world)

    def failpoint(t: str, index: int) -> None:
        if (t, index) == (trigger, k):
            raise Crash

    world.node.controller.failpoint = failpoint
    with pytest.raises(Crash):
        world.node.controller.fire(trigger, **_args(trigger, world))
    owed = world.node.store.read().pending
    restarted = world.reopen()
    if DEFINITION.transition(trigger).effects:
        assert owed is not None and owed.trigger == trigger and owed.done == k
        restarted.node.controller.resume()
    else:  # nothing to resume: the transition did not happen, and is simply fired again
        assert owed is None and restarted.node.store.read().state == source
        restarted.node.controller.fire(trigger, **_args(trigger, restarted))
    assert _snapshot(restarted) == _snapshot(reference)
