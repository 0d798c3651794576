"""What `status` reports: read without the lock, never blocking the daemon."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .machine import situation
from .node import Node


@dataclass(frozen=True)
class Status:
    state: str
    meaning: str
    situation: str
    selected: str | None
    last_good: str | None
    signal: dict[str, Any] | None
    gate: str
    held_assets: tuple[str, ...]
    last_result: dict[str, Any] | None
    owed: dict[str, Any] | None
    allowed: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "meaning": self.meaning,
            "situation": self.situation,
            "selected": self.selected,
            "last_good": self.last_good,
            "signal": self.signal,
            "gate": self.gate,
            "held_assets": list(self.held_assets),
            "last_result": self.last_result,
            "owed": self.owed,
            "allowed": list(self.allowed),
        }


def status(node: Node) -> Status:
    doc = node.store.read()
    host = node.host
    sig = host.signal()
    held: tuple[str, ...] = ()
    if sig is not None:
        held = tuple(str(p) for p in host.asset_paths() if p.exists())
    owed = None
    if doc.pending is not None:
        p = doc.pending
        owed = {"trigger": p.trigger, "from": p.source, "to": p.dest,
                "effects": p.effects[p.done:]}
    return Status(
        state=doc.state,
        meaning=node.controller.definition.state(doc.state).description,
        situation=situation(doc),
        selected=host.releases.selected(),
        last_good=host.releases.last_good(),
        signal=None if sig is None else {k: v for k, v in sig.to_json().items()},
        gate="open" if host.gate.is_open() else "closed",
        held_assets=held,
        last_result=doc.last_result,
        owed=owed,
        allowed=node.controller.allowed(doc.state),
    )
