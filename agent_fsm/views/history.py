"""What `history` reports: the transitions kept in the state file, as a timeline of stays.

Each history entry records a transition at the moment it finished. A *stay* in a state begins
with the entry whose destination differs from the one before it and lasts until the next such
entry (self-transitions such as `candidate_started` or `settle` do not end a stay). The same
reckoning gives `status` its "in this state for" and `metrics` its seconds in the current state.
Read without the lock, like `status`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..wiring import Node


@dataclass(frozen=True)
class Entry:
    """One transition; `lasted` is set on the entry that began a stay in `dest`."""

    time: float
    trigger: str
    source: str
    dest: str
    release: str | None
    upgrade: tuple[str, str] | None  # (from, to) of the upgrade in flight, if any
    lasted: float | None  # seconds in `dest` from here until it was left (or until now)
    current: bool  # this entry began the stay the node is still in

    def to_json(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "trigger": self.trigger,
            "from": self.source,
            "to": self.dest,
            "release": self.release,
            "upgrade": None if self.upgrade is None else {
                "from": self.upgrade[0], "to": self.upgrade[1]},
            "lasted_seconds": self.lasted,
            "current": self.current,
        }


@dataclass(frozen=True)
class History:
    entries: tuple[Entry, ...]  # oldest first, after filtering and the limit
    kept: int  # how many transitions the state file holds (bounded by history_limit)
    limit: int  # the configured history_limit
    upgrade: str | None  # the --upgrade filter, if any
    tones: Mapping[str, str]  # how each state reads: "ok", "none", "busy" or "bad"

    def to_json(self) -> list[dict[str, Any]]:
        return [e.to_json() for e in self.entries]


def timeline(raw: Sequence[dict[str, Any]], now: float) -> tuple[Entry, ...]:
    """Entries with each stay's length; the last stay is still going on at `now`."""
    starts = [i for i, e in enumerate(raw) if i == 0 or e["to"] != raw[i - 1]["to"]]
    lasted: dict[int, tuple[float, bool]] = {}
    for k, i in enumerate(starts):
        if k + 1 < len(starts):
            lasted[i] = (float(raw[starts[k + 1]]["time"]) - float(raw[i]["time"]), False)
        else:
            lasted[i] = (max(now - float(raw[i]["time"]), 0.0), True)
    out = []
    for i, e in enumerate(raw):
        up = e.get("upgrade")
        length, current = lasted.get(i, (None, False))
        out.append(Entry(
            time=float(e["time"]), trigger=str(e["trigger"]), source=str(e["from"]),
            dest=str(e["to"]), release=e.get("release"),
            upgrade=None if not up else (str(up["from"]), str(up["to"])),
            lasted=length, current=current,
        ))
    return tuple(out)


def current_stay(raw: Sequence[dict[str, Any]], now: float) -> Entry | None:
    """The entry that began the stay the node is in now (None with no history)."""
    # Only the tail of the history since the last change of state: `status` and `metrics` call
    # this on every run, and a long history (a high history_limit) must not slow them down.
    start = len(raw) - 1
    while start > 0 and raw[start - 1]["to"] == raw[start]["to"]:
        start -= 1
    return timeline(raw[start:], now)[0] if raw else None


def skipped_effects(raw: Sequence[dict[str, Any]],
                    cycle_starts: frozenset[str]) -> tuple[dict[str, Any], ...]:
    """Effects let fail (logged, e.g. a refused `reset-failed`) since the latest install,
    upgrade or rollback began: what an operator should know about the node's last cycle."""
    found: list[dict[str, Any]] = []
    for e in reversed(raw):
        found[:0] = [{"time": e["time"], "trigger": e["trigger"], **s}
                     for s in e.get("skipped") or ()]
        if e["trigger"] in cycle_starts:
            break
    return tuple(found)


def history(node: Node, *, limit: int | None = None, upgrade: str | None = None) -> History:
    """The kept transitions, oldest first; `upgrade` keeps those of upgrades to that version."""
    raw = node.store.read().history
    entries = timeline(raw, node.clock.now())
    if upgrade is not None:
        entries = tuple(e for e in entries if e.upgrade is not None and e.upgrade[1] == upgrade)
    if limit is not None:
        entries = entries[-limit:] if limit > 0 else ()
    d = node.definition
    tones = {s: node.groups.tone(s, d.initial) for s in d.state_names}
    return History(entries, len(raw), node.config.history_limit, upgrade, tones)
