"""What `upgrade --force` goes past is decided in one place (`upgrade.overrides`): each of a
hold, an inhibitor and a known-bad mark refuses an unforced upgrade in its own words, and a
forced one names it before going past it."""

from __future__ import annotations

import os

import pytest

from agent_fsm.actions import upgrade as upgrading
from agent_fsm.errors import Refused
from agent_fsm.node.records import hold, known_bad
from agent_fsm.upgrade import overrides
from agent_fsm.upgrade.registry import load_definition
from tests.helpers import World


def _hold(w: World) -> None:
    hold.write(w.paths.hold_file, hold.Hold("quarter close", w.clock.now(), None))


def _inhibit(w: World) -> None:
    d = w.paths.real(w.node.config.inhibitor_dir)
    d.mkdir(parents=True, exist_ok=True)
    (d / "backup").write_text(f"name=nightly-backup\nreason=copying\npid={os.getpid()}\n")


def _mark(w: World) -> None:
    known_bad.mark(w.paths.known_bad_file, known_bad.Mark("2.0.0", w.clock.now(),
                                                          "crashed at start", "crashed", 1.0))


# (condition, what blocks, words of its refusal, words of what forcing goes past)
BLOCKERS = [
    ("not_held", _hold, "upgrades are held", "the hold (held"),
    ("not_inhibited", _inhibit, "upgrades are inhibited by 1 workload(s)",
     "the inhibitor nightly-backup"),
    ("not_known_bad", _mark, "release 2.0.0 is known bad", "the known-bad mark of 2.0.0"),
]


@pytest.fixture
def ready(world: World) -> World:
    world.installed("1.0.0")
    world.add_release("2.0.0")
    return world


def test_every_override_is_a_condition_of_begin_upgrade_and_of_nothing_else() -> None:
    """The definition asks each override on `begin_upgrade` only: a rollback is never held."""
    definition = load_definition()
    asked = {(t.trigger, c) for t in definition.transitions for c in t.conditions}
    names = {o.condition for o in overrides.OVERRIDES}
    assert {c for _, c in asked if c in names} == names == {c for c, *_ in BLOCKERS}
    assert {t for t, c in asked if c in names} == {"begin_upgrade"}


@pytest.mark.parametrize(("condition", "block", "refused", "passed"), BLOCKERS,
                         ids=[b[0] for b in BLOCKERS])
def test_refused_in_its_own_words_unless_forced(ready: World, condition: str, block: object,
                                                refused: str, passed: str) -> None:
    """Unforced, the upgrade is refused naming what holds it and `--force`; forced, `upgrade`
    says what it goes past, then begins."""
    block(ready)  # type: ignore[operator]
    with pytest.raises(Refused) as err:
        upgrading.upgrade(ready.node, "2.0.0")
    assert refused in str(err.value) and "--force" in str(err.value)
    told: list[upgrading.Step] = []
    done = upgrading.upgrade(ready.node, "2.0.0", force=True, tell=told.append)
    said = [s.what for s in told if isinstance(s, upgrading.Forced)]
    assert len(said) == 1 and said[0].startswith(passed), said
    assert done.to_version == "2.0.0" and ready.node.store.read().state == "candidate_running"
