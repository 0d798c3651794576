"""The upgrade signal: a file that exists exactly while an upgrade is pending.

While it exists, the service assets on disk are the last-good version's and are held. It names
the versions, counts the candidate's starts (so a restarted candidate can judge itself failed)
and carries the judgment's deadline.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from ... import files
from ...errors import Invalid, SignalError
from ..state import validate


class UpgradeSignal(NamedTuple):
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
        return self._replace(attempt=self.attempt + 1)


def read(path: Path) -> UpgradeSignal | None:
    """The pending upgrade's signal, or None when no upgrade is pending. A signal that is not
    JSON, or a field of it that is not valid (`validate.signal_body`), is SignalError: one line
    naming the file, the field and its value; the file is left as it is."""
    raw = files.read_bytes(path)
    if raw is None:
        return None
    try:
        data = validate.parse(raw)
        validate.signal_body(data)
    except ValueError as exc:  # Invalid among them
        sep = ": " if isinstance(exc, Invalid) else " "
        raise SignalError(
            f"upgrade signal {path}{sep}{exc}; it was left untouched; run `agent-fsm doctor`"
        ) from None
    return UpgradeSignal(
        from_version=data["from"],
        to_version=data["to"],
        attempt=data["attempt"],
        started=float(data["started"]),
        deadline=float(data["deadline"]),
    )


def write(path: Path, signal: UpgradeSignal) -> None:
    """Write the signal; DiskError (the old signal as it was) when the disk fails it."""
    files.atomic_write(path, (json.dumps(signal.to_json(), indent=2) + "\n").encode(), 0o644)


def clear(path: Path) -> bool:
    return files.remove(path)
