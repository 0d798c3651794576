"""The upgrade signal: a file that exists exactly while an upgrade is pending.

While it exists, the service assets on disk are the last-good version's and are held. It names the
versions, counts the candidate's starts (so a restarted candidate can judge itself failed) and
carries the judgment's deadline. The candidate's daemon counts `attempt`. The last-good's
`start-check` counts `starts` before the candidate's code runs (absent: none counted), so a
candidate that crashes before it counts is still bounded. It is `<state_dir>/upgrade-signal.json`, a
document of kind `signal` (`document_file`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from ... import files
from ...errors import DocumentError, SignalError
from ..state import validate
from ..state.document_file import Kind

KIND = Kind("signal", "upgrade signal", "the signal", 1, lambda body, _: validate.signal_body(body),
            64 << 10, 0o644)  # schema 0: no schema, no checksum


class UpgradeSignal(NamedTuple):
    from_version: str
    to_version: str
    attempt: int
    started: float
    deadline: float
    starts: int = 0  # counted by the last-good's start check (agent.start_check)
    # The start check's record (agent.start_timeout): the attempts in a row that systemd's
    # start timeout ended, and, for the start it let go last, `NRestarts` then and the time by
    # which a start timeout had ended it (systemd's monotonic clock, seconds).
    timeouts: int = 0
    timed_out_by: float | None = None
    unit_restarts: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "from": self.from_version,
            "to": self.to_version,
            "attempt": self.attempt,
            "started": self.started,
            "deadline": self.deadline,
            **({"starts": self.starts} if self.starts else {}),  # absent when none: as before
            **({"timeouts": self.timeouts} if self.timeouts else {}),
            **({"timed_out_by": self.timed_out_by, "unit_restarts": self.unit_restarts}
               if self.timed_out_by is not None and self.unit_restarts is not None else {}),
        }

    def next_attempt(self) -> UpgradeSignal:
        return self._replace(attempt=self.attempt + 1)


def read(path: Path) -> UpgradeSignal | None:
    """The pending upgrade's signal, or None when no upgrade is pending. A signal the document
    format refuses (damaged, newer, an invalid field: `validate.signal_body`) is SignalError, one
    line naming the file, the field and its value. The file is left as it is."""
    try:
        data = KIND.read(path)
    except DocumentError as exc:
        raise SignalError(str(exc)) from None
    if data is None:
        return None
    return UpgradeSignal(
        from_version=data["from"],
        to_version=data["to"],
        attempt=data["attempt"],
        started=float(data["started"]),
        deadline=float(data["deadline"]),
        starts=data.get("starts", 0),
        timeouts=data.get("timeouts", 0),
        timed_out_by=None if data.get("timed_out_by") is None else float(data["timed_out_by"]),
        unit_restarts=data.get("unit_restarts"),
    )


def write(path: Path, signal: UpgradeSignal) -> None:
    """Write the signal; DiskError (the old signal as it was) when the disk fails it."""
    KIND.write(path, signal.to_json())


def clear(path: Path) -> bool:
    return files.remove(path)
