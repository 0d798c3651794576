"""What a node keeps of its channel in `<state_dir>/channel/`: the newest root it believes
(`root.json`, as fetched) and its follows' record (`follow.json`). The record holds the newest index
believed, so an older one is refused as a replay. It also holds the last follow's outcome: what it
saw and why it took no other. `status` shows it; nothing on the way back reads it."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any, NamedTuple

from ... import files
from ...errors import ChannelError, DocumentError
from ..state import validate
from ..state.document_file import Kind
from .documents import MAX_DOCUMENT, Root, parse_root, read_envelope
from .trust import Seen

MAX_BYTES = 4 << 20
MAX_MESSAGE = 1000
MAX_LISTED = 200  # versions of the index the record lists (the newest)


class Outcome(enum.StrEnum):
    upgraded = "upgraded"  # it took a version, judged ok
    rolled_back = "rolled_back"  # it took a version, judged failed and rolled back
    started = "started"  # it began an upgrade and did not wait for its judgment
    up_to_date = "up_to_date"  # nothing newer is eligible
    nothing_eligible = "nothing_eligible"
    held = "held"  # a hold, an inhibitor or a pending upgrade: nothing fetched
    refused = "refused"  # the channel's root, index or release was refused: nothing changed
    failed = "failed"  # the server could not be reached, or the add or upgrade failed


class Available(NamedTuple):
    version: str
    rollout: int
    bucket: int
    why_not: str | None

    def to_json(self) -> dict[str, Any]:
        return self._asdict()


class Record(NamedTuple):
    time: float
    outcome: Outcome
    message: str
    root_version: int
    seen: Seen | None = None  # the newest index believed
    took: str | None = None  # the version this follow upgraded to
    available: tuple[Available, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"time": self.time, "outcome": self.outcome.value, "message": self.message,
                "root_version": self.root_version,
                "seen": None if self.seen is None else self.seen._asdict(),
                "took": self.took, "available": [a.to_json() for a in self.available]}


def _check(data: dict[str, Any], schema: int) -> None:
    validate.time(data.get("time", validate.MISSING), "time")
    validate.one_of(data.get("outcome", validate.MISSING), "outcome", {o.value for o in Outcome})
    message = data.get("message", validate.MISSING)
    if not isinstance(message, str) or len(message) > MAX_MESSAGE:
        raise validate.invalid("message", message, f"at most {MAX_MESSAGE} characters")
    validate.count(data.get("root_version", validate.MISSING), "root_version")
    seen = validate.nullable(data, "seen")
    if seen is not None:
        seen = validate.obj(seen, "seen")
        validate.count(seen.get("version", validate.MISSING), "seen.version")
        if not isinstance(seen.get("digest"), str):
            raise validate.invalid("seen.digest", seen.get("digest"), "a digest")
    validate.version(validate.nullable(data, "took"), "took", optional=True)
    for i, a in enumerate(validate.array(data.get("available", validate.MISSING), "available")):
        at = f"available[{i}]"
        a = validate.obj(a, at)
        validate.version(a.get("version", validate.MISSING), f"{at}.version")
        validate.count(a.get("rollout", validate.MISSING), f"{at}.rollout", 100)
        validate.count(a.get("bucket", validate.MISSING), f"{at}.bucket", 99)
        why = validate.nullable(a, "why_not")
        if why is not None and (not isinstance(why, str) or len(why) > MAX_MESSAGE):
            raise validate.invalid(f"{at}.why_not", why, f"at most {MAX_MESSAGE} characters")


KIND = Kind("channel", "channel record", "the record", 1, _check, MAX_BYTES, 0o600, utf8=True)


def read(directory: Path) -> Record | None:
    """The last follow's record, or None before the first; DocumentError when it is damaged."""
    data = KIND.read(directory / "follow.json")
    if data is None:
        return None
    seen = data["seen"]
    return Record(float(data["time"]), Outcome(data["outcome"]), data["message"],
                  data["root_version"], None if seen is None else Seen(seen["version"],
                                                                       seen["digest"]),
                  data["took"], tuple(Available(a["version"], a["rollout"], a["bucket"],
                                                a["why_not"]) for a in data["available"]))


def write(directory: Path, record: Record) -> None:
    files.ensure_private_dir(directory)
    body = record._replace(message=record.message[:MAX_MESSAGE],
                           available=record.available[:MAX_LISTED]).to_json()
    KIND.write(directory / "follow.json", body)


def trusted_root(directory: Path, first: Path) -> tuple[Root, bytes]:
    """The newest root this node believes: the one it kept, else the config's first (unchecked: the
    operator put it there)."""
    for path, what in ((directory / "root.json", "the kept channel root"),
                       (first, "the channel root the config names")):
        try:
            data = files.read_regular(path, MAX_DOCUMENT)
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            raise ChannelError(f"cannot read {what} {path}: {exc}") from None
        return parse_root(read_envelope(data, f"{what} {path}").body, f"{what} {path}"), data
    raise ChannelError(f"no channel root at {first}: copy the channel's root.json there "
                       "(`[channel] root` names it)")


def keep_root(directory: Path, data: bytes) -> None:
    files.ensure_private_dir(directory)
    files.atomic_write(directory / "root.json", data, 0o600)


def view(directory: Path, url: str | None, name: str) -> dict[str, Any] | None:
    """The channel as `status --json` shows it; null when the node follows none. Else its url and
    name, the last follow's record (null fields before the first), and `error` when the record is
    damaged."""
    if url is None:
        return None
    base: dict[str, Any] = {"url": url, "name": name, "error": None}
    empty = {**Record(0.0, Outcome.failed, "", 0).to_json(), "time": None, "outcome": None,
             "message": None, "root_version": None}
    try:
        rec = read(directory)
    except DocumentError as exc:
        return {**base, **empty, "error": str(exc)}
    if rec is None:
        return {**base, **empty}
    return {**base, **rec.to_json()}


__all__ = ["DocumentError", "Outcome", "Record", "Seen", "read", "write"]
