"""What systemd says of units, for readers (`status`): `systemctl show` and the journal's last
error, each run with a short, hard timeout, and without the `subprocess` module (readers stay
light: docs/design.md), through `os.posix_spawnp` and a pipe.

Nothing here raises for systemd's sake: a missing `systemctl`, a refusal, no systemd at all or
a timeout is returned as the reason the state is unknown.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import time
from collections.abc import Sequence

from .environment import child_environment

READ_TIMEOUT = 2.0  # seconds a reader waits for systemctl (or journalctl) before giving up
MAX_OUTPUT = 1 << 20

PROPERTIES = ("Id", "LoadState", "ActiveState", "SubState", "Result", "NRestarts",
              "ExecMainStatus", "StateChangeTimestampMonotonic", "RestartUSec",
              "RestartUSecNext")  # RestartUSecNext: systemd >= 254 (growing restart delays)


class Unread(Exception):
    """The command could not say: `reason` in words ("not found", "exited 1: ...")."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _output(argv: Sequence[str], timeout: float) -> str:
    """`argv`'s stdout (stderr's last line in the error), within `timeout` seconds or killed."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    actions = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
               (os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2),
               (os.POSIX_SPAWN_CLOSE, out_r), (os.POSIX_SPAWN_CLOSE, err_r)]
    env = child_environment({"SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0", "LC_ALL": "C"})
    try:
        pid = os.posix_spawnp(argv[0], list(argv), env, file_actions=actions, setsid=True)
    except OSError as exc:
        for fd in (out_r, out_w, err_r, err_w):
            os.close(fd)
        raise Unread(f"`{argv[0]}` could not run: {exc.strerror or exc}") from None
    os.close(out_w)
    os.close(err_w)
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    open_fds = [out_r, err_r]
    end = time.monotonic() + timeout
    try:
        while open_fds:
            left = end - time.monotonic()
            if left <= 0:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                raise Unread(f"`{argv[0]}` did not answer within {timeout:g}s")
            ready, _, _ = select.select(open_fds, [], [], left)
            for fd in ready:
                data = os.read(fd, 65536)
                if not data:
                    open_fds.remove(fd)
                elif sum(map(len, chunks[fd])) < MAX_OUTPUT:
                    chunks[fd].append(data)
        _, status = os.waitpid(pid, 0)
        pid = 0
    finally:
        for fd in (out_r, err_r):
            os.close(fd)
        if pid:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    out, err = (b"".join(chunks[fd]).decode("utf-8", "replace") for fd in (out_r, err_r))
    if code != 0:
        lines = (err or out).strip().splitlines()
        raise Unread(f"`{argv[0]}` exited {code}" + (f": {lines[-1]}" if lines else ""))
    return out


def show(prefix: Sequence[str], units: Sequence[str],
         timeout: float = READ_TIMEOUT) -> dict[str, dict[str, str]]:
    """Each unit's `PROPERTIES`, by its name, from one `systemctl show`; Unread if it cannot."""
    argv = [*prefix, "show", f"--property={','.join(PROPERTIES)}", "--", *units]
    text = _output(argv, timeout)
    blocks = [dict(line.partition("=")[::2] for line in block.splitlines() if "=" in line)
              for block in text.split("\n\n") if block.strip()]
    if len(blocks) != len(units):
        raise Unread(f"`{prefix[-1]} show` answered for {len(blocks)} of {len(units)} units")
    return {unit: block for unit, block in zip(units, blocks, strict=True)}


def journalctl(prefix: Sequence[str]) -> list[str] | None:
    """The journalctl beside the configured systemctl (the same wrapper, its last word
    replaced), or None when the prefix does not end in a systemctl."""
    last = prefix[-1] if prefix else ""
    if os.path.basename(last) != "systemctl":
        return None
    return [*prefix[:-1], last[: len(last) - len("systemctl")] + "journalctl"]


def last_error(prefix: Sequence[str], units: Sequence[str],
               timeout: float = READ_TIMEOUT) -> str | None:
    """The last line the units logged at priority error or worse; None when there is none or
    the journal cannot be read (it is a hint, never needed)."""
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
    """A timespan as `systemctl show` prints it ("100ms", "1min 30s", "infinity") in seconds;
    None when it is not one."""
    parts = _SPAN.findall(span)
    if not parts or _SPAN.sub("", span).strip():
        return None
    return sum(float(n) * _SECONDS[u] for n, u in parts)
