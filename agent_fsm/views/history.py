"""What `history` reports: the journal's transitions, as a timeline of stays.

Each entry records a transition when it finished. A *stay* begins with an entry whose destination
differs from the one before, and lasts until the next such entry; self-transitions
(`candidate_started`, `settle`) do not end it. The state file keeps the current stay's start
(`StateDoc.since`), so `status` and `metrics` need not read the journal. Read without the lock.
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
    reason: tuple[str, str] | None = None  # (class, words) of the result this transition reported
    superseded_by: str | None = None  # an owed transition replaced by this trigger (never run)
    unknown: tuple[str, ...] = ()  # what such a transition named that this agent-fsm did not know
    # A crash loop's one entry: how many restarts after crashes, since when; `time` is the latest's.
    crash_loop: tuple[int, float] | None = None

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
            "reason_class": None if self.reason is None else self.reason[0],
            "reason": None if self.reason is None else self.reason[1],
            "superseded_by": self.superseded_by,
            "unknown": list(self.unknown),
            "restarts": None if self.crash_loop is None else self.crash_loop[0],
            "first": None if self.crash_loop is None else self.crash_loop[1],
        }


@dataclass(frozen=True)
class History:
    entries: tuple[Entry, ...]  # oldest first, after filtering and the limit
    kept: int  # how many transitions are kept (the last history_limit)
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
            reason=(str(e["reason_class"]), str(e.get("reason"))) if "reason_class" in e else None,
            superseded_by=e.get("superseded_by"), unknown=tuple(e.get("unknown", ())),
            crash_loop=(int(e["restarts"]), float(e["first"])) if "restarts" in e else None,
        ))
    return tuple(out)


def history(node: Node, *, limit: int | None = None, upgrade: str | None = None) -> History:
    """The kept transitions, oldest first; `upgrade` keeps those of upgrades to that version."""
    raw = node.store.history()[-node.config.history_limit:]
    entries = timeline(raw, node.clock.now())
    if upgrade is not None:
        entries = tuple(e for e in entries if e.upgrade is not None and e.upgrade[1] == upgrade)
    if limit is not None:
        entries = entries[-limit:] if limit > 0 else ()
    d = node.definition
    tones = {s: node.groups.tone(s, d.initial) for s in d.state_names}
    return History(entries, len(raw), node.config.history_limit, upgrade, tones)
