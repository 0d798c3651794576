"""Versions known bad on this node: each one that rolled back here, when and why, and the node's
rollbacks counted by reason class.

`<state_dir>/known-bad.json` lives apart from the state file. It outlives upgrades, `release list`
and `status` read it without the machine, and a damaged one must never make the state file
unreadable (that would stop the way back). The rollback's transitions mark the candidate
(`mark_known_bad`, tolerant: a damaged record never blocks a rollback). A judged-ok upgrade of a
version clears its mark (`clear_known_bad`). `begin_upgrade` refuses a marked version
(`not_known_bad`) unless forced. Writes are atomic and reads validated, as a document of kind
`known-bad` (`document_file`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from ...errors import DocumentError, KnownBadDamaged, Refused
from ..paths import Paths
from ..state import validate
from ..state.document_file import Kind
from ..state.reasons import CLASSES, MAX_REASON
from .hold import utc

MAX_BYTES = 256 * 1024
FILE_MODE = 0o644  # `status` and `release list` read it as any user, as they read state.json


class Mark(NamedTuple):
    """A version that rolled back here: when (the result's time), why, and which upgrade."""

    version: str
    time: float
    reason: str
    reason_class: str
    started: float  # the upgrade's start: a re-run of the same rollback marks (and counts) once

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "time": self.time, "reason": self.reason,
                "reason_class": self.reason_class}


class Record(NamedTuple):
    marks: dict[str, Mark]
    rollbacks: dict[str, int]  # by reason class


def _damaged(file: Path, why: str) -> KnownBadDamaged:
    return KnownBadDamaged(f"known-bad record {file} is damaged ({why}); it was left untouched: "
                           "check it and remove it (upgrades then refuse no version), or go past "
                           "it with `agent-fsm upgrade --force`")


def _check(data: dict[str, Any], schema: int) -> None:
    for v, m in validate.obj(data.get("versions", validate.MISSING), "versions").items():
        at = f"versions.{v}"
        validate.version(v, at)
        m = validate.obj(m, at)
        reason = m.get("reason", validate.MISSING)
        if not isinstance(reason, str) or len(reason) > MAX_REASON:
            raise validate.invalid(f"{at}.reason", reason, f"at most {MAX_REASON} characters")
        validate.time(m.get("time", validate.MISSING), f"{at}.time")
        validate.one_of(m.get("reason_class", validate.MISSING), f"{at}.reason_class", CLASSES)
        validate.time(m.get("started", validate.MISSING), f"{at}.started")
    for k, n in validate.obj(data.get("rollbacks", validate.MISSING), "rollbacks").items():
        validate.one_of(k, "rollbacks", CLASSES)
        validate.count(n, f"rollbacks.{k}")


KIND = Kind("known-bad", "known-bad record", "the record", 1, _check, MAX_BYTES,
            FILE_MODE)  # schema 0: no schema


def read(file: Path) -> Record:
    """The record (empty when there is none); KnownBadDamaged, naming the field, when it is not
    valid."""
    try:
        data = KIND.read(file)
    except DocumentError as exc:
        raise _damaged(file, exc.why) from None
    if data is None:
        return Record({}, {})
    marks = {v: Mark(v, float(m["time"]), m["reason"], m["reason_class"], float(m["started"]))
             for v, m in data["versions"].items()}
    return Record(marks, dict(data["rollbacks"]))


def write(file: Path, record: Record) -> None:
    body = {"versions": {v: {**m.to_json(), "started": m.started}
                         for v, m in sorted(record.marks.items())},
            "rollbacks": dict(sorted(record.rollbacks.items()))}
    KIND.write(file, body)


def mark(file: Path, new: Mark) -> bool:
    """Mark `new.version` known bad and count the rollback by its class, once per upgrade
    (`started`). False when this rollback was marked already."""
    record = read(file)
    old = record.marks.get(new.version)
    if old is not None and old.started == new.started:
        return False
    record.marks[new.version] = new
    record.rollbacks[new.reason_class] = record.rollbacks.get(new.reason_class, 0) + 1
    write(file, record)
    return True


def clear(file: Path, version: str) -> bool:
    """Take the mark off `version` (its upgrade was judged ok); False when it had none."""
    if not file.exists():
        return False
    record = read(file)
    if record.marks.pop(version, None) is None:
        return False
    write(file, record)
    return True


def refusal(file: Path, version: str) -> Refused | None:
    """The refusal of an upgrade to a version marked known bad, or while the record is damaged.
    `upgrade.overrides` decides when it is forced."""
    try:
        found = read(file).marks.get(version)
    except KnownBadDamaged as exc:
        return Refused(str(exc))
    if found is None:
        return None
    return Refused(f"release {version} is known bad: it rolled back on this node at "
                   f"{utc(found.time)} ({found.reason_class}: {found.reason}); upgrade to "
                   f"another version, or try it again anyway with `agent-fsm upgrade --to "
                   f"{version} --force`")


def words(file: Path, version: str) -> str | None:
    """What a forced upgrade to `version` goes past, in words, if anything."""
    try:
        found = read(file).marks.get(version)
    except KnownBadDamaged as exc:
        return f"the damaged known-bad record ({exc})"
    if found is None:
        return None
    return f"the known-bad mark of {version} (rolled back at {utc(found.time)}: {found.reason})"


def view(paths: Paths) -> tuple[tuple[dict[str, Any], ...], str | None]:
    """What `status` shows: the marks, oldest first, and the damage, if the record is damaged."""
    try:
        record = read(paths.known_bad_file)
    except KnownBadDamaged as exc:
        return (), str(exc)
    return tuple(m.to_json() for m in sorted(record.marks.values(), key=lambda m: m.time)), None


def without(paths: Paths, versions: tuple[str, ...]) -> tuple[str, ...]:
    """`versions` but the known-bad ones: what `status` may suggest upgrading to."""
    bad = {m["version"] for m in view(paths)[0]}
    return tuple(v for v in versions if v not in bad)


def rollbacks(paths: Paths) -> dict[str, int]:
    """Rollbacks on this node by reason class (empty when the record is missing or damaged)."""
    try:
        return read(paths.known_bad_file).rollbacks
    except KnownBadDamaged:
        return {}
