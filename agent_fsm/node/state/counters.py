"""The node's lifetime counters: upgrades by outcome, rollbacks, candidate starts.

`tally` advances them in the same atomic write that records a transition, so each counts once
even across crashes. Which transitions count comes from the definition (`CountRules`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple


class Counters(NamedTuple):
    """Counts that only go up over a node's life."""

    upgrades_ok: int = 0
    upgrades_rolled_back: int = 0
    rollbacks: int = 0  # rollbacks completed: the last-good running again
    attempts: int = 0  # starts of a candidate being judged


class CountRules(NamedTuple):
    upgrades_ok: frozenset[tuple[str, str]]  # (trigger, source) publishing an ok result
    upgrades_rolled_back: frozenset[tuple[str, str]]  # ... publishing a rolled-back result
    rollbacks: frozenset[str]  # triggers that finish a rollback
    attempts: frozenset[str]  # triggers that count a candidate's start
    # Triggers that begin an install, an upgrade or a rollback: the effects let fail in the
    # previous cycle are no longer shown (`journal.advanced_skipped`).
    cycle_starts: frozenset[str] = frozenset()


def tally(c: Counters, entry: Mapping[str, Any], rules: CountRules) -> Counters:
    """`c` plus what one history entry (a finished transition) adds."""
    trigger, source = entry.get("trigger"), entry.get("from")
    if (trigger, source) in rules.upgrades_ok:
        return c._replace(upgrades_ok=c.upgrades_ok + 1)
    if (trigger, source) in rules.upgrades_rolled_back:
        return c._replace(upgrades_rolled_back=c.upgrades_rolled_back + 1)
    if trigger in rules.rollbacks:
        return c._replace(rollbacks=c.rollbacks + 1)
    if trigger in rules.attempts:
        return c._replace(attempts=c.attempts + 1)
    return c


def to_json(c: Counters) -> dict[str, int]:
    return c._asdict()
