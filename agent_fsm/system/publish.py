"""Publishing an upgrade's result: a record per upgrade, and an optional configured command.

The record is what `status` shows as the last result and what a fleet tool can collect; the
command (config `publish_command`, given the result as JSON on stdin) reaches anything further.
Either failing raises PublishError; the daemon retries, and the gate stays closed until it works.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from .. import files
from ..errors import DiskError, PublishError
from . import proc

Outcome = Literal["ok", "rolled_back"]


@dataclass(frozen=True)
class Result:
    from_version: str
    to_version: str
    outcome: Outcome
    started: float
    time: float
    reason: str | None = None  # why, in words (a failed check's last line, an exit status...)
    reason_class: str | None = None  # why, as one of `node.reasons.CLASSES`

    def to_json(self) -> dict[str, Any]:
        return {
            "from": self.from_version,
            "to": self.to_version,
            "outcome": self.outcome,
            "started": self.started,
            "time": self.time,
            **({} if self.reason is None else {"reason": self.reason}),
            **({} if self.reason_class is None else {"reason_class": self.reason_class}),
        }


class Publisher(Protocol):
    def record(self, result: Result) -> None:
        """Keep the result locally and durably, queued for delivery; never runs a command."""

    def deliver(self) -> int:
        """Deliver the queued results, oldest first; the number delivered. Raises
        PublishError at the first that fails (it and the later ones stay queued)."""

    def publish(self, result: Result) -> None:
        """Record the result, then deliver everything queued (it included)."""


class RecordPublisher:
    """Records `<state_dir>/results/<started>-<to>.json` and queues a copy in the outbox
    (`<state_dir>/outbox/`); delivering runs the configured command with the result as JSON on
    stdin and takes the copy out of the outbox once the command exits 0. `check` (given by the
    wiring: `node.validate.result_file`) refuses a queued copy that is not a valid result, with
    ValueError naming the field; it then stays queued, and so do the ones after it."""

    def __init__(self, results_dir: Path, command: tuple[str, ...] = (),
                 timeout: float = 30.0, outbox: Path | None = None,
                 check: Callable[[bytes], None] | None = None) -> None:
        self.results_dir = results_dir
        self.outbox = outbox if outbox is not None else results_dir.parent / "outbox"
        self.command = command
        self.timeout = timeout
        self.check = check

    def _name(self, result: Result) -> str:
        return f"{int(result.started * 1000)}-{result.to_version}.json"

    def record_path(self, result: Result) -> Path:
        return self.results_dir / self._name(result)

    def record(self, result: Result) -> None:
        payload = (json.dumps(result.to_json(), indent=2) + "\n").encode()
        try:
            files.atomic_write(self.record_path(result), payload, 0o644)
            files.atomic_write(self.outbox / self._name(result), payload, 0o600)
        except DiskError as exc:  # a PublishError: the daemon retries it
            raise PublishError(f"could not record the result in {self.results_dir}: {exc}") from None

    def queued(self) -> list[Path]:
        try:
            return sorted((p for p in self.outbox.iterdir() if p.suffix == ".json"),
                          key=lambda p: (int(n) if (n := p.name.split("-", 1)[0]).isdigit()
                                         else -1, p.name))
        except FileNotFoundError:
            return []

    def _payload(self, path: Path) -> str:
        """A queued result's text, checked: PublishError, naming it, when it cannot be sent."""
        try:
            raw = path.read_bytes()
            if self.check is not None:
                self.check(raw)
            return raw.decode("utf-8")
        except (OSError, ValueError) as exc:
            why = f"could not be read: {exc}" if isinstance(exc, OSError) else str(exc)
            raise PublishError(
                f"queued result {path}: {why}; it was not sent, and it and the results after "
                "it stay queued; correct it or move it aside"
            ) from None

    def deliver(self) -> int:
        delivered = 0
        for path in self.queued():
            payload = self._payload(path)
            if self.command:
                self._run(payload)
            files.remove(path)
            delivered += 1
        return delivered

    def publish(self, result: Result) -> None:
        self.record(result)
        self.deliver()

    def _run(self, payload: str) -> None:
        name = self.command[0]
        try:
            done = proc.run(self.command, timeout=self.timeout, stdin=payload)
        except proc.CouldNotRun as exc:
            raise PublishError(f"publish command {name} could not run: {exc.reason}") from None
        if done.returncode != 0:
            raise PublishError(f"publish command {name} exited {done.returncode}"
                               + (f": {done.tail}" if done.tail else ""))
