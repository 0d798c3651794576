"""Publishing an upgrade's result: a record per upgrade, and an optional configured command.

The record is what `status` shows as the last result and a fleet tool can collect; the command
(`publish_command`, the bare result as JSON on stdin) reaches anything further. Either failing
raises PublishError; the daemon retries with the gate closed. The record and its queued copy are
state-dir documents (kind, schema, checksum).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from .. import files
from ..errors import DiskError, DocumentError, PublishError
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
    # Set when the result was queued instead of published before the gate opened
    # (`complete_queued`): since when the publisher had been failing.
    publisher_unreachable_since: float | None = None
    # The channel an upgrade begun by `follow` came from: {name, index_version}.
    channel: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "from": self.from_version,
            "to": self.to_version,
            "outcome": self.outcome,
            "started": self.started,
            "time": self.time,
            **({} if self.reason is None else {"reason": self.reason}),
            **({} if self.reason_class is None else {"reason_class": self.reason_class}),
            **({} if self.publisher_unreachable_since is None
               else {"publisher_unreachable_since": self.publisher_unreachable_since}),
            **({} if self.channel is None else {"channel": dict(self.channel)}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Result:
        return cls(data["from"], data["to"], data["outcome"], data["started"], data["time"],
                   data.get("reason"), data.get("reason_class"),
                   data.get("publisher_unreachable_since"), data.get("channel"))


class Document(Protocol):
    """A result's file: `node.state.validate.RESULT`, given by the wiring, as this layer does not
    import the node's."""

    def encode(self, body: dict[str, Any]) -> bytes: ...

    def read(self, path: Path) -> dict[str, Any] | None:
        """The result in the file, checked; DocumentError if it is refused."""


class Publisher(Protocol):
    def record(self, result: Result) -> None:
        """Keep the result locally and durably, queued for delivery; never runs a command."""

    def deliver(self) -> int:
        """Deliver the queued results, oldest first; return how many (0 with no command to deliver
        to: the queue is only emptied). PublishError at the first that fails; it and the later ones
        stay queued."""

    def publish(self, result: Result) -> None:
        """Record the result, then deliver everything queued (it included)."""


class RecordPublisher:
    """Records `<state_dir>/results/<started>-<to>.json` and queues a copy in `<state_dir>/outbox/`,
    both documents. Delivering runs the configured command with the result as JSON on stdin, and
    takes the copy out of the outbox once the command exits 0. A queued copy the document refuses
    (damaged, or an invalid result: it names the field) is not sent and stays queued, with the ones
    after it."""

    def __init__(self, results_dir: Path, command: tuple[str, ...] = (),
                 timeout: float = 30.0, outbox: Path | None = None, *,
                 document: Document) -> None:
        self.results_dir = results_dir
        self.outbox = outbox if outbox is not None else results_dir.parent / "outbox"
        self.command = command
        self.timeout = timeout
        self.document = document

    def _name(self, result: Result) -> str:
        return f"{int(result.started * 1000)}-{result.to_version}.json"

    def record_path(self, result: Result) -> Path:
        return self.results_dir / self._name(result)

    def record(self, result: Result) -> None:
        payload = self.document.encode(result.to_json())
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
        """A queued result's JSON as the command gets it (the bare result), checked: PublishError,
        naming it, when it cannot be sent."""
        try:
            body = self.document.read(path)
            detail = " could not be read: it is gone" if body is None else ""
        except DocumentError as exc:
            body, detail = None, exc.detail
        if body is None:
            raise PublishError(
                f"queued result {path}{detail}; it was not sent, and it and the results after "
                "it stay queued; correct it or move it aside"
            )
        return json.dumps(Result.from_json(body).to_json(), indent=2) + "\n"

    def deliver(self) -> int:
        delivered = 0
        for path in self.queued():
            payload = self._payload(path)
            if self.command:
                self._run(payload)
                delivered += 1
            files.remove(path)
        return delivered

    def publish(self, result: Result) -> None:
        self.record(result)
        self.deliver()

    def _run(self, payload: str) -> None:
        name = self.command[0]
        try:
            # In a group of its own: at its timeout the command and whatever it started are killed
            # whole, since a child holding its output open would outlive it.
            done = proc.run(self.command, timeout=self.timeout, stdin=payload, group=True)
        except proc.CouldNotRun as exc:
            raise PublishError(f"publish command {name} could not run: {exc.reason}") from None
        if done.returncode != 0:
            raise PublishError(f"publish command {name} exited {done.returncode}"
                               + (f": {done.tail}" if done.tail else ""))
