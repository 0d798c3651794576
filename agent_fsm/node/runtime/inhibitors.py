"""Inhibitors: files a workload drops into a runtime directory while it must not be interrupted.

The directory is the config's `inhibitor_dir` (default /run/agent-fsm-inhibitors: a tmpfs, so
inhibitors end at boot). Each file not starting with "." is one inhibitor, written as
`KEY=value` lines a shell can write with printf: `name=` (default: the file's name), `reason=`
(required) and optionally `pid=`; blank lines and `#` comments are skipped, other keys ignored.
While any inhibitor counts, `begin_upgrade` is refused (the `not_inhibited` condition) unless
forced. One naming a PID that no longer exists is *stale*: reported, never honoured. One that
cannot be read or is not in the format still counts (fail safe) and is named with what is wrong.
Nothing on the way back reads them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from ... import files
from ...errors import Refused
from ...untrusted import control_character
from ..paths import Paths

MAX_BYTES = 4096
MAX_PID = 2**22  # the kernel's highest pid_max
MAX_VALUE = 500


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` exists (in agent-fsm's PID namespace)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by someone else
        return True
    return True


class Inhibitor(NamedTuple):
    file: str
    name: str
    reason: str | None
    pid: int | None
    since: float | None  # the file's modification time
    stale: bool  # it names a PID that no longer exists: reported, not honoured
    error: str | None  # unreadable, or not in the format: it still counts (fail safe)

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "name": self.name, "reason": self.reason, "pid": self.pid,
                "since": self.since, "stale": self.stale, "error": self.error}

    def words(self) -> str:
        pid = "" if self.pid is None else f" (pid {self.pid})"
        what = self.error if self.error is not None else repr(self.reason)
        return f"{self.name}{pid}: {what} [{self.file}]"


def _parse(text: str) -> dict[str, str]:
    """The known keys of an inhibitor file; ValueError naming the first line that is wrong."""
    found: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, eq, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key:
            raise ValueError(f"line {number} is not KEY=value")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        if key in ("name", "reason", "pid"):
            if control_character(value) is not None or len(value) > MAX_VALUE:
                raise ValueError(f"{key}= on line {number} is not one line of at most "
                                 f"{MAX_VALUE} characters")
            found[key] = value
    return found


def read_one(file: Path, alive: Callable[[int], bool] = pid_alive) -> Inhibitor | None:
    """The inhibitor in `file`, or None when it is gone (its workload removed it meanwhile)."""
    name, since = file.name, None
    try:
        since = os.lstat(file).st_mtime
        text = files.read_regular(file, MAX_BYTES).decode("utf-8")
        data = _parse(text)
        if not data.get("reason"):
            raise ValueError("it has no reason= line")
        pid = None
        if "pid" in data:
            if not data["pid"].isdigit() or not 0 < int(data["pid"]) <= MAX_PID:
                raise ValueError(f"pid={data['pid']!r} is not a process ID")
            pid = int(data["pid"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        if isinstance(exc, UnicodeDecodeError):
            why = "it is not UTF-8 text"
        return Inhibitor(str(file), name, None, None, since, False,
                         f"unreadable inhibitor ({why}); it counts until removed")
    return Inhibitor(str(file), data.get("name") or name, data["reason"], pid, since,
                     pid is not None and not alive(pid), None)


def scan(where: Path, alive: Callable[[int], bool] = pid_alive) -> tuple[Inhibitor, ...]:
    """Every inhibitor in the directory, by file name; none when the directory is absent."""
    try:
        names = sorted(os.listdir(where))
    except FileNotFoundError:
        return ()
    except OSError as exc:  # fail safe: a directory we cannot list may hold inhibitors
        return (Inhibitor(str(where), where.name, None, None, None, False,
                          f"the inhibitor directory cannot be listed ({exc.strerror}); it "
                          "counts as an inhibitor until it can"),)
    found = (read_one(where / n, alive) for n in names if not n.startswith("."))
    return tuple(i for i in found if i is not None)


def refusal(inhibitors: tuple[Inhibitor, ...]) -> Refused | None:
    """The refusal of an upgrade while any inhibitor counts (not stale); `upgrade.overrides`
    decides when it is forced."""
    counting = [i for i in inhibitors if not i.stale]
    if not counting:
        return None
    stale = len(inhibitors) - len(counting)
    also = f" ({stale} stale, not honoured)" if stale else ""
    return Refused(f"upgrades are inhibited by {len(counting)} workload(s): "
                   f"{'; '.join(i.words() for i in counting)}{also}; an inhibitor is lifted when "
                   "its workload removes its file; override them for this upgrade with "
                   "`agent-fsm upgrade --force`")


def view(paths: Paths) -> tuple[dict[str, Any], ...]:
    """The inhibitors as `status --json` shows them (stale ones too, marked)."""
    return tuple(i.to_json() for i in scan(paths.inhibitor_dir))
