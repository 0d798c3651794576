"""Versions known good on this node, and what the way back last did to a damaged last-good.

`<state_dir>/known-good.json` (kind `known-good`) lives apart from the state file, as the known-bad
record does. `versions` holds each version promoted to last-good here (`install`, `activate`, a
judged-ok upgrade) with the time of its last promotion. `way_back` holds what the way back last did
when the last-good failed its check, with when, the release, the files and why: `repaired` (files
put back from intact copies in the store) or `fell_back` (to the newest intact known-good version,
the last-good since). The way back reads it to choose where to fall back and never stops on it: a
damaged record reads as empty, and a failed write is logged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from ...errors import DocumentError
from ..state import validate
from ..state.document_file import Kind
from ..state.reasons import MAX_REASON

MAX_BYTES = 256 * 1024
FILE_MODE = 0o644  # `status` reads it as any user
ACTIONS = ("repaired", "fell_back")
MAX_FILES = 20  # named in `way_back.files`; more are counted in `way_back.more`


class WayBack(NamedTuple):
    """What the way back did to a damaged last-good: `release`, `repaired` (its `files`, each from a
    copy) or `fell_back` to `to`. `reason`: what was damaged, in words."""

    time: float
    release: str
    action: str
    to: str
    files: tuple[str, ...]
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"time": self.time, "release": self.release, "action": self.action,
                "to": self.to, "files": list(self.files[:MAX_FILES]),
                "more": max(0, len(self.files) - MAX_FILES), "reason": self.reason[:MAX_REASON]}

    def words(self) -> str:
        if self.action == "repaired":
            return (f"last-good {self.release} was damaged and repaired from intact copies in "
                    f"the store ({', '.join(self.files[:3])}{' …' if len(self.files) > 3 else ''})")
        return (f"last-good {self.release} was damaged beyond repair ({self.reason}); fell back "
                f"to {self.to}, the newest intact known-good release, now the last-good")


class Record(NamedTuple):
    versions: dict[str, float]  # promoted here: when, last
    way_back: WayBack | None


def _check(data: dict[str, Any], _schema: int) -> None:
    for v, t in validate.obj(data.get("versions", validate.MISSING), "versions").items():
        validate.version(v, f"versions.{v}")
        validate.time(t, f"versions.{v}")
    way = data.get("way_back", validate.MISSING)
    if way is None:
        return
    w = validate.obj(way, "way_back")
    validate.time(w.get("time", validate.MISSING), "way_back.time")
    validate.version(w.get("release", validate.MISSING), "way_back.release")
    validate.version(w.get("to", validate.MISSING), "way_back.to")
    validate.one_of(w.get("action", validate.MISSING), "way_back.action", ACTIONS)
    names = w.get("files", validate.MISSING)
    if not isinstance(names, list) or len(names) > MAX_FILES \
            or not all(isinstance(n, str) and len(n) <= 4096 for n in names):
        raise validate.invalid("way_back.files", names, f"at most {MAX_FILES} paths")
    validate.count(w.get("more", validate.MISSING), "way_back.more")
    reason = w.get("reason", validate.MISSING)
    if not isinstance(reason, str) or len(reason) > MAX_REASON:
        raise validate.invalid("way_back.reason", reason, f"at most {MAX_REASON} characters")


KIND = Kind("known-good", "known-good record", "the record", 1, _check, MAX_BYTES, FILE_MODE)


def read(file: Path) -> Record:
    """The record, empty when there is none. DocumentError, naming the field, when it is not valid
    (the way back reads it with `read_or_empty`)."""
    data = KIND.read(file)
    if data is None:
        return Record({}, None)
    w = data.get("way_back")
    way = None if w is None else WayBack(
        float(w["time"]), w["release"], w["action"], w["to"], tuple(w["files"]), w["reason"])
    return Record({v: float(t) for v, t in data["versions"].items()}, way)


def read_or_empty(file: Path) -> Record:
    try:
        return read(file)
    except DocumentError:
        return Record({}, None)


def _write(file: Path, record: Record) -> None:
    KIND.write(file, {"versions": dict(sorted(record.versions.items())),
                      "way_back": None if record.way_back is None else record.way_back.to_json()})


def promoted(file: Path, version: str, now: float) -> None:
    """Note `version` promoted to last-good at `now`. DiskError if it cannot be written. A damaged
    record starts again: it only says where the way back may fall back to."""
    record = read_or_empty(file)
    record.versions[version] = now
    _write(file, record)


def took_way_back(file: Path, event: WayBack) -> None:
    """Record what the way back did (`way_back`). DiskError if it cannot be written."""
    record = read_or_empty(file)
    _write(file, record._replace(way_back=event))


def newest_first(record: Record) -> list[str]:
    """The known-good versions, the one promoted last first."""
    return [v for v, _ in sorted(record.versions.items(), key=lambda kv: kv[1], reverse=True)]
