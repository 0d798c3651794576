"""The operator's holds on upgrades: `hold` and `unhold` (`--force` goes past one:
`upgrade.overrides`).

A hold is written and lifted under the writers' lock, so it never lands inside a transition's
conditions; it refuses only `begin_upgrade` (`node.hold`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import AgentFsmError
from ..node.records import hold as hold_file
from ..node.records.hold import Hold, utc
from ..wiring import Node


@dataclass(frozen=True)
class HoldDone:
    """What `hold` or `unhold` did, in one line, and the hold in place after it (or None)."""

    message: str
    hold: Hold | None
    time: float

    def to_json(self) -> dict[str, Any]:
        return {"message": self.message,
                "hold": None if self.hold is None else self.hold.to_json(self.time)}


def hold(node: Node, reason: str, until: float | None) -> HoldDone:
    """Hold upgrades (replacing any hold) until `until`, or until `unhold` when None."""
    reason = hold_file.check_reason(reason)
    path = node.paths.hold_file
    with node.store.locked():
        now = node.clock.now()
        current = hold_file.read(path)
        if current is not None and current.error is not None:
            raise AgentFsmError(f"{current.error}; nothing was written")
        new = Hold(reason, now, until)
        hold_file.write(path, new)
    replaced = "" if current is None else f" (it replaces the hold {current.words()})"
    end = "until `agent-fsm unhold`" if until is None else f"until {utc(until)}"
    return HoldDone(f"upgrades held {end}: {reason!r}{replaced}; `agent-fsm upgrade` is refused "
                    "meanwhile unless forced (--force); rollbacks are never held", new, now)


def unhold(node: Node) -> HoldDone:
    """Lift the hold (an expired or damaged one too); say so when there was none."""
    path = node.paths.hold_file
    with node.store.locked():
        now = node.clock.now()
        current = hold_file.read(path)
        hold_file.clear(path)
    if current is None:
        return HoldDone("no hold to lift: upgrades were not held", None, now)
    return HoldDone(f"hold lifted (it was {current.words()})", None, now)

