"""Which version of a channel a node takes, and why it takes no other.

A node's bucket for a version is a number 0-99 drawn from its machine id and that version. It is
stable for the pair and differs across versions, so one rollout's first nodes are not always the
next one's. A rollout of P % covers the buckets below P, so raising P never takes a node out. A node
takes the newest version that is not revoked, not known bad here, past its not-before time and
covered by its rollout. It takes it when it is newer than what the node runs, or what it runs is
revoked.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from ..releases.pointers import natural_key
from ..sha256 import hexdigest
from .documents import Entry, Index, stamp

BUCKETS = 100


def bucket(machine_id: str, version: str) -> int:
    """This node's bucket (0-99) for `version`."""
    h = hexdigest(f"agent-fsm-rollout\0{machine_id.strip()}\0{version}".encode())
    return int(h[:16], 16) % BUCKETS


def covers(rollout: int, node_bucket: int) -> bool:
    return node_bucket < rollout


@dataclass(frozen=True)
class Verdict:
    version: str
    bucket: int
    why_not: str | None  # None: eligible here


@dataclass(frozen=True)
class Choice:
    take: Entry | None
    why: str  # what the follow does, in words: "1.3.0: newest eligible", "up to date on 1.2.0"
    verdicts: tuple[Verdict, ...]  # every version of the index, newest first


def verdict(entry: Entry, *, machine_id: str, known_bad: Collection[str],
            now: datetime) -> Verdict:
    b = bucket(machine_id, entry.version)
    if entry.revoked is not None:
        why: str | None = f"revoked: {entry.revoked}"
    elif entry.version in known_bad:
        why = "known bad here"
    elif entry.not_before is not None and now < entry.not_before:
        why = f"not before {stamp(entry.not_before)}"
    elif not covers(entry.rollout, b):
        why = f"rollout {entry.rollout} %, this node's bucket {b}"
    else:
        why = None
    return Verdict(entry.version, b, why)


def choose(index: Index, *, running: str | None, machine_id: str, known_bad: Collection[str],
           now: datetime) -> Choice:
    """What a follow of `index` does on a node that runs `running`."""
    entries = sorted(index.releases, key=lambda e: natural_key(e.version), reverse=True)
    verdicts = tuple(verdict(e, machine_id=machine_id, known_bad=known_bad, now=now)
                     for e in entries)
    eligible = [e for e, v in zip(entries, verdicts, strict=True) if v.why_not is None]
    mine = index.entry(running) if running is not None else None
    revoked = mine is not None and mine.revoked is not None
    newest = eligible[0] if eligible else None
    if newest is None:
        why = (f"{running} is revoked, and no version is eligible to go to" if revoked
               else "no version is eligible for this node")
        return Choice(None, why, verdicts)
    if running is None or revoked or natural_key(newest.version) > natural_key(running):
        why = (f"{running} is revoked: {newest.version} is the newest eligible" if revoked
               else f"{newest.version} is the newest eligible")
        return Choice(newest, why, verdicts)
    return Choice(None, f"up to date: {running} runs and nothing newer is eligible", verdicts)
