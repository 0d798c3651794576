"""The operator's hold on upgrades: a small file in the state directory, with a reason and an end.

`agent-fsm hold` writes it (under the writers' lock, atomically) and `agent-fsm unhold` removes
it; while it exists and has not expired, `begin_upgrade` is refused (the `not_held` condition)
unless forced. Nothing on the way back reads it. A hold file that cannot be read or validated
still holds (someone meant to stop upgrades) and is named, until `unhold` removes it. It is a
document of kind `hold` (`document_file`).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

from ... import files
from ...errors import DocumentError, Refused
from ...untrusted import control_character
from ..paths import Paths
from ..state import validate
from ..state.document_file import Kind

MAX_BYTES = 16 * 1024
MAX_REASON = 500
MAX_AHEAD = 3650 * 86400  # ten years: further is a typo, not a plan
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(?:\d{1,7}[smhdw])+")
UNTIL_FORMS = ("an ISO 8601 time (2026-12-01T18:00:00+01:00; UTC when it has no offset) or a "
               "duration from now (30m, 2h, 1d, 1w, 1h30m)")


def utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class Hold(NamedTuple):
    """A hold as read; `error` set when its file is damaged (it still holds, until lifted)."""

    reason: str
    since: float | None
    until: float | None
    error: str | None = None

    def expired(self, now: float) -> bool:
        return self.error is None and self.until is not None and self.until <= now

    def to_json(self, now: float) -> dict[str, Any]:
        return {"reason": self.reason, "since": self.since, "until": self.until,
                "expired": self.expired(now), "error": self.error}

    def words(self) -> str:
        """The hold in one phrase: since when, until when, and why."""
        if self.error is not None:
            return self.error
        since = "" if self.since is None else f" since {utc(self.since)}"
        until = " until lifted" if self.until is None else f" until {utc(self.until)}"
        return f"held{since}{until}: {self.reason!r}"


def parse_until(text: str, now: float) -> float:
    """The end of a hold from `--until`, in seconds since the epoch; ValueError saying why not."""
    value = text.strip()
    if _DURATION.fullmatch(value):
        ahead = sum(int(n) * _UNITS[u] for n, u in re.findall(r"(\d+)([smhdw])", value))
        if ahead <= 0:
            raise ValueError(f"--until {text!r} is no time at all; give {UNTIL_FORMS}")
        until = now + ahead
    else:
        try:
            when = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"--until {text!r} is not {UNTIL_FORMS}") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        until = when.timestamp()
        if until <= now:
            raise ValueError(f"--until {text!r} ({utc(until)}) is in the past; give a later time")
    if until - now > MAX_AHEAD:
        raise ValueError(f"--until {text!r} is more than ten years away; lift the hold with "
                         "`agent-fsm unhold` instead of giving no end")
    return until


def check_reason(text: str) -> str:
    """The reason as kept: one line of at most MAX_REASON characters; ValueError if not."""
    reason = text.strip()
    if not reason:
        raise ValueError("--reason is empty; say why upgrades are held (it is shown to whoever "
                         "is refused)")
    found = control_character(reason)
    if found is not None:
        raise ValueError(f"--reason contains a control character ({found}); give one line")
    if len(reason) > MAX_REASON:
        raise ValueError(f"--reason has {len(reason)} characters; at most {MAX_REASON}")
    return reason


def _check(data: dict[str, Any], schema: int) -> None:
    reason = data.get("reason", validate.MISSING)
    if not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_REASON \
            or control_character(reason) is not None:
        raise validate.invalid("reason", reason, f"one line of 1 to {MAX_REASON} characters")
    validate.time(data.get("since", validate.MISSING), "since")
    until = data.get("until", validate.MISSING)
    if until is not None:
        validate.time(until, "until")


KIND = Kind("hold", "hold file", "the hold", 1, _check, MAX_BYTES, 0o600)


def read(file: Path) -> Hold | None:
    """The hold, or None when there is none; a damaged file is a Hold with `error` set."""
    try:
        data = KIND.read(file)
    except DocumentError as exc:
        return Hold("(unreadable hold file)", None, None,
                    error=f"hold file {file} is damaged ({exc.why}); it holds upgrades until "
                          "`agent-fsm unhold` removes it")
    if data is None:
        return None
    until = data["until"]
    return Hold(data["reason"], float(data["since"]), None if until is None else float(until))


def write(file: Path, hold: Hold) -> None:
    KIND.write(file, {"reason": hold.reason, "since": hold.since, "until": hold.until})


def clear(file: Path) -> bool:
    return files.remove(file)


def refusal(hold: Hold | None, now: float) -> Refused | None:
    """The refusal of an upgrade while `hold` counts (not expired); `upgrade.overrides` decides
    when it is forced."""
    if hold is None or hold.expired(now):
        return None
    return Refused(f"upgrades are {hold.words()}; lift the hold with `agent-fsm unhold`, or "
                   "override it for this upgrade with `agent-fsm upgrade --force`")


def view(paths: Paths, now: float) -> dict[str, Any] | None:
    """The hold as `status --json` shows it: null, or {reason, since, until, expired, error}."""
    found = read(paths.hold_file)
    return None if found is None else found.to_json(now)
