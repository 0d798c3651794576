"""What `upgrade --force` goes past, decided here alone: a hold, an inhibitor and a known-bad mark.

Each is a condition of `begin_upgrade` that, unforced, says what holds the upgrade and how to
lift it. Forced, `passed` names it. Only `begin_upgrade` asks, so none refuses a rollback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from ..errors import AgentFsmError, Refused
from ..machine.engine import Step
from ..node.paths import Paths
from ..node.records import hold, known_bad
from ..node.runtime import inhibitors
from .effectors import Effectors


class Override(NamedTuple):
    condition: str  # its name in states/agent-upgrade.toml
    refusal: Callable[[Paths, float, str], Refused | None]  # (paths, now, version), unforced
    passed: Callable[[Paths, float, str], tuple[str, ...]]  # what forcing goes past, in words


def _hold(paths: Paths, now: float, _version: str) -> Refused | None:
    return hold.refusal(hold.read(paths.hold_file), now)


def _hold_passed(paths: Paths, now: float, _version: str) -> tuple[str, ...]:
    found = hold.read(paths.hold_file)
    return (f"the hold ({found.words()})",) if found and not found.expired(now) else ()


def _inhibitors(paths: Paths, _now: float, _version: str) -> Refused | None:
    return inhibitors.refusal(inhibitors.scan(paths.inhibitor_dir))


def _inhibitors_passed(paths: Paths, _now: float, _version: str) -> tuple[str, ...]:
    return tuple(f"the inhibitor {i.words()}" for i in inhibitors.scan(paths.inhibitor_dir)
                 if not i.stale)


def _known_bad(paths: Paths, _now: float, version: str) -> Refused | None:
    return known_bad.refusal(paths.known_bad_file, version)


def _known_bad_passed(paths: Paths, _now: float, version: str) -> tuple[str, ...]:
    said = known_bad.words(paths.known_bad_file, version)
    return (said,) if said else ()


OVERRIDES = (
    Override("not_held", _hold, _hold_passed),
    Override("not_inhibited", _inhibitors, _inhibitors_passed),
    Override("not_known_bad", _known_bad, _known_bad_passed),
)


def passed(paths: Paths, now: float, version: str) -> tuple[str, ...]:
    """What a forced upgrade to `version` goes past now, in words (nothing: none holds it)."""
    return tuple(w for o in OVERRIDES for w in o.passed(paths, now, version))


def _condition(override: Override) -> Callable[[Effectors, Step], AgentFsmError | None]:
    def check(effectors: Effectors, step: Step) -> AgentFsmError | None:
        if step.arg("force"):
            return None
        return override.refusal(effectors.paths, effectors.clock.now(), str(step.arg("release")))

    check.__name__ = check.__qualname__ = override.condition
    return check


not_held, not_inhibited, not_known_bad = (_condition(o) for o in OVERRIDES)
