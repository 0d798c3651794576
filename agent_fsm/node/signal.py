"""The upgrade signal: a file that exists exactly while an upgrade is pending.

While it exists, the service assets on disk are the last-good version's and are held. It names
the versions, counts the candidate's starts (so a restarted candidate can judge itself failed)
and carries the judgment's deadline.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .. import files
from ..errors import SignalError


@dataclass(frozen=True)
class UpgradeSignal:
    from_version: str
    to_version: str
    attempt: int
    started: float
    deadline: float

    def to_json(self) -> dict[str, Any]:
        return {
            "from": self.from_version,
            "to": self.to_version,
            "attempt": self.attempt,
            "started": self.started,
            "deadline": self.deadline,
        }

    def next_attempt(self) -> UpgradeSignal:
        return replace(self, attempt=self.attempt + 1)


def read(path: Path) -> UpgradeSignal | None:
    """The pending upgrade's signal, or None when no upgrade is pending."""
    raw = files.read_bytes(path)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        return UpgradeSignal(
            from_version=str(data["from"]),
            to_version=str(data["to"]),
            attempt=int(data["attempt"]),
            started=float(data["started"]),
            deadline=float(data["deadline"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise SignalError(
            f"upgrade signal {path} is unreadable ({exc.__class__.__name__}: {exc}); it was left "
            "untouched; run `agent-fsm doctor`, or `agent-fsm recover` to roll back"
        ) from None


def write(path: Path, signal: UpgradeSignal) -> None:
    files.atomic_write(path, (json.dumps(signal.to_json(), indent=2) + "\n").encode(), 0o644)


def clear(path: Path) -> bool:
    return files.remove(path)
