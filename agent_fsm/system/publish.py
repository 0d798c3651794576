"""Publishing an upgrade's result: a record per upgrade, and an optional configured command.

The record is what `status` shows as the last result and what a fleet tool can collect; the
command (config `publish_command`, given the result as JSON on stdin) reaches anything further.
Either failing raises PublishError; the daemon retries, and the gate stays closed until it works.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from .. import files
from ..errors import PublishError
from . import proc

Outcome = Literal["ok", "rolled_back"]


@dataclass(frozen=True)
class Result:
    from_version: str
    to_version: str
    outcome: Outcome
    started: float
    time: float

    def to_json(self) -> dict[str, Any]:
        return {
            "from": self.from_version,
            "to": self.to_version,
            "outcome": self.outcome,
            "started": self.started,
            "time": self.time,
        }


class Publisher(Protocol):
    def publish(self, result: Result) -> None: ...


class RecordPublisher:
    """Writes `<state_dir>/results/<started>-<to>.json`, then runs the configured command."""

    def __init__(self, results_dir: Path, command: tuple[str, ...] = (),
                 timeout: float = 30.0) -> None:
        self.results_dir = results_dir
        self.command = command
        self.timeout = timeout

    def record_path(self, result: Result) -> Path:
        return self.results_dir / f"{int(result.started * 1000)}-{result.to_version}.json"

    def publish(self, result: Result) -> None:
        payload = json.dumps(result.to_json(), indent=2) + "\n"
        try:
            files.atomic_write(self.record_path(result), payload.encode(), 0o644)
        except OSError as exc:
            raise PublishError(f"could not record the result in {self.results_dir}: {exc}") from None
        if not self.command:
            return
        name = self.command[0]
        try:
            done = proc.run(self.command, timeout=self.timeout, stdin=payload)
        except proc.CouldNotRun as exc:
            raise PublishError(f"publish command {name} could not run: {exc.reason}") from None
        if done.returncode != 0:
            raise PublishError(f"publish command {name} exited {done.returncode}"
                               + (f": {done.tail}" if done.tail else ""))
