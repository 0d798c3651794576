"""What systemd says of units, each question with a short hard timeout.

`blocks` parses `systemctl show`'s output, for readers and writers. For readers (`status`), `show`
and the journal's last error run through `proc`, which needs no `subprocess`, so readers stay light.
Nothing here raises for systemd's sake. A missing `systemctl`, a refusal, no systemd or a timeout
comes back as the reason the state is unknown.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from . import proc

READ_TIMEOUT = 2.0  # seconds a reader waits for systemctl (or journalctl) before giving up
MAX_OUTPUT = 1 << 20
READ_ENV = {"SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0", "LC_ALL": "C"}

PROPERTIES = ("Id", "LoadState", "ActiveState", "SubState", "Result", "NRestarts",
              "ExecMainStatus", "StateChangeTimestampMonotonic", "RestartUSec",
              "RestartUSecNext")  # RestartUSecNext: systemd >= 254 (growing restart delays)


class Unread(Exception):
    """The command could not say: `reason` in words ("not found", "exited 1: ...")."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def blocks(text: str) -> list[dict[str, str]]:
    """`systemctl show`'s output as its blocks, one per unit in the order asked (blank lines
    between). Each block is its `NAME=VALUE` lines as a dict."""
    return [dict(line.partition("=")[::2] for line in block.splitlines() if "=" in line)
            for block in text.split("\n\n") if block.strip()]


def _output(argv: Sequence[str], timeout: float, tz: str | None = None) -> str:
    """`argv`'s stdout (stderr's last line in the error), within `timeout` seconds or killed."""
    try:
        done = proc.run(argv, timeout=timeout, stdin="",
                        env=READ_ENV if tz is None else {**READ_ENV, "TZ": tz}, group=True,
                        limit=MAX_OUTPUT)
    except proc.CouldNotRun as exc:
        if exc.error is None:
            raise Unread(f"`{argv[0]}` did not answer within {timeout:g}s") from None
        raise Unread(f"`{argv[0]}` could not run: {exc.error.strerror or exc.error}") from None
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise Unread(f"`{argv[0]}` exited {done.returncode}" + (f": {lines[-1]}" if lines else ""))
    return done.stdout


def show(prefix: Sequence[str], units: Sequence[str],
         timeout: float = READ_TIMEOUT) -> dict[str, dict[str, str]]:
    """Each unit's `PROPERTIES`, by its name, from one `systemctl show`; Unread if it cannot."""
    argv = [*prefix, "show", f"--property={','.join(PROPERTIES)}", "--", *units]
    found = blocks(_output(argv, timeout))
    if len(found) != len(units):
        raise Unread(f"`{prefix[-1]} show` answered for {len(found)} of {len(units)} units")
    return dict(zip(units, found, strict=True))


def journalctl(prefix: Sequence[str]) -> list[str] | None:
    """The journalctl beside the configured systemctl (the same wrapper, its last word replaced).
    None when the prefix does not end in a systemctl."""
    last = prefix[-1] if prefix else ""
    if os.path.basename(last) != "systemctl":
        return None
    return [*prefix[:-1], last[: len(last) - len("systemctl")] + "journalctl"]


def last_error(prefix: Sequence[str], units: Sequence[str],
               timeout: float = READ_TIMEOUT) -> str | None:
    """The last line the units logged at priority error or worse. None when there is none or the
    journal cannot be read: it is a hint, never needed."""
    argv = journalctl(prefix)
    if argv is None:
        return None
    for unit in units:
        argv += ["-u", unit]
    try:
        text = _output([*argv, "-p", "err", "-n", "1", "-o", "cat", "-q", "--no-pager"], timeout)
    except Unread:
        return None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:500] if lines else None


_SPAN = re.compile(r"(\d+(?:\.\d+)?)\s*(us|ms|min|s|h|d|w)\b")
_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0,
            "w": 604800.0}


def seconds(span: str) -> float | None:
    """A timespan as `systemctl show` prints it ("100ms", "1min 30s", "infinity") in seconds; None
    when it is not one."""
    parts = _SPAN.findall(span)
    if not parts or _SPAN.sub("", span).strip():
        return None
    return sum(float(n) * _SECONDS[u] for n, u in parts)


def timer(prefix: Sequence[str], unit: str,
          timeout: float = READ_TIMEOUT) -> tuple[str, str, float | None]:
    """A timer's ActiveState, UnitFileState and next elapse, from one `systemctl show` with TZ=UTC;
    Unread if it cannot. The elapse is in seconds since the epoch, read from "Thu 2026-12-03
    12:58:05 UTC" (systemd 252). None when none is due or it is not printed in UTC."""
    import calendar
    import time

    argv = [*prefix, "show", "--property=ActiveState,UnitFileState,NextElapseUSecRealtime",
            "--", unit]
    found = blocks(_output(argv, timeout, tz="UTC"))
    shown = found[0] if found else {}
    try:
        at: float | None = float(calendar.timegm(time.strptime(
            shown.get("NextElapseUSecRealtime", ""), "%a %Y-%m-%d %H:%M:%S UTC")))
    except ValueError:  # none due, or not printed in UTC (a wrapper that drops TZ)
        at = None
    return shown.get("ActiveState", "unknown"), shown.get("UnitFileState", ""), at
