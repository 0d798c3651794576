"""The node's lifetime counters: upgrades by outcome, rollbacks, candidate starts.

Kept in the state file and advanced by each finished transition (`tally`), in the same atomic
write that records the transition, so each is counted exactly once even across crashes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Counters:
    """Counts that only go up over a node's life."""

    upgrades_ok: int = 0
    upgrades_rolled_back: int = 0
    rollbacks: int = 0  # rollbacks completed: the last-good running again (`recovered`)
    attempts: int = 0  # starts of a candidate (`candidate_started`)


PUBLISHES_ROLLED_BACK = {("judge_failed", "candidate_running"), ("recover", "candidate_running")}


def tally(c: Counters, entry: Mapping[str, Any]) -> Counters:
    """`c` plus what one history entry (a finished transition) adds to it."""
    trigger, source = entry.get("trigger"), entry.get("from")
    if trigger == "complete":
        return replace(c, upgrades_ok=c.upgrades_ok + 1)
    if (trigger, source) in PUBLISHES_ROLLED_BACK:
        return replace(c, upgrades_rolled_back=c.upgrades_rolled_back + 1)
    if trigger == "recovered":
        return replace(c, rollbacks=c.rollbacks + 1)
    if trigger == "candidate_started":
        return replace(c, attempts=c.attempts + 1)
    return c


def from_history(history: Iterable[Mapping[str, Any]]) -> Counters:
    """Counters tallied from history: seeds a state file written before counters were kept."""
    c = Counters()
    for entry in history:
        c = tally(c, entry)
    return c


def to_json(c: Counters) -> dict[str, int]:
    return asdict(c)
