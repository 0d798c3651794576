"""Publishing an upgrade's result: a record per upgrade, and an optional configured command.

The record is what `status` shows as the last result and what a fleet tool can collect; the
command (config `publish_command`, given the result as JSON on stdin) reaches anything further.
Either failing raises PublishError; the daemon retries, and the gate stays closed until it works.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from .. import files
from ..errors import PublishError

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
        try:
            proc = subprocess.run(list(self.command), input=payload, text=True,
                                  capture_output=True, timeout=self.timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PublishError(f"publish command {self.command[0]} could not run: {exc}") from None
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()
            raise PublishError(
                f"publish command {self.command[0]} exited {proc.returncode}"
                + (f": {tail[-1]}" if tail else "")
            )
