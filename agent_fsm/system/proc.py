"""Running a command: the one place that starts a process, waits for it and keeps its output.

It spawns with `os.posix_spawn` and reads both pipes itself, without `subprocess`, so `status` runs
systemctl through it and stays light (docs/design.md). Every command gets
`environment.child_environment`: agent-fsm's own, less systemd's notify and watchdog variables.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from ..errors import CouldNotRun as CouldNotRun  # raised by run(); callers catch it here
from .environment import child_environment

_CHUNK = 65536
# Python ignores these; a child gets them back at their default, as `subprocess` gives them.
_DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)


class Completed(NamedTuple):
    returncode: int
    stdout: str
    stderr: str

    @property
    def tail(self) -> str:
        """What the command said last: the last line of stderr, or of stdout when stderr is empty;
        "" when it said nothing."""
        return last_line(self.stderr or self.stdout)


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def run(argv: Sequence[str], *, timeout: float | None, stdin: str | None = None,
        env: Mapping[str, str] | None = None, cwd: Path | str | None = None,
        group: bool = False, limit: int | None = None,
        on_stderr: Callable[[bytes], None] | None = None) -> Completed:
    """Run `argv` to completion and capture its output as text.

    `stdin` is its input (else it inherits ours); `env` is added to `child_environment`; `cwd` is
    its directory. A non-zero exit is returned, not raised. CouldNotRun when it does not start or
    outlives `timeout` (it is killed). `group`: its own session, which the timeout kills whole (a
    script's children would hold its output open). `limit`: the most bytes kept of each stream; the
    rest is read and dropped. `on_stderr`: also given each chunk of stderr as read (progress).
    """
    environ = child_environment(env)
    fds: list[int] = []
    try:
        out_r, out_w = _pipe(fds)
        err_r, err_w = _pipe(fds)
        actions: list[tuple[int, ...]] = [(os.POSIX_SPAWN_DUP2, out_w, 1),
                                          (os.POSIX_SPAWN_DUP2, err_w, 2)]
        in_w = -1
        if stdin is not None:
            in_r, in_w = _pipe(fds)
            actions.insert(0, (os.POSIX_SPAWN_DUP2, in_r, 0))
        pid = _spawn(argv, environ, actions, cwd, group)
        for fd in (out_w, err_w, *([in_r] if stdin is not None else [])):
            _close(fds, fd)
        try:
            out, err = _communicate(argv, pid, out_r, err_r, in_w,
                                    (stdin or "").encode(), timeout, group, limit, fds,
                                    on_stderr)
        except CouldNotRun:
            raise  # killed and reaped already
        except BaseException:  # Ctrl-C, say: the command does not outlive the wait for it
            _kill(pid, group)
            raise
        status = _reap(pid)
    finally:
        for fd in fds:
            os.close(fd)
    return Completed(os.waitstatus_to_exitcode(status), _text(out), _text(err))


def _pipe(fds: list[int]) -> tuple[int, int]:
    r, w = os.pipe()  # close-on-exec: the child keeps only what is dup2'ed onto 0, 1 and 2
    fds += (r, w)
    return r, w


def _close(fds: list[int], fd: int) -> None:
    fds.remove(fd)
    os.close(fd)


def _spawn(argv: Sequence[str], env: Mapping[str, str], actions: list[tuple[int, ...]],
           cwd: Path | str | None, group: bool) -> int:
    """Start `argv[0]` in `cwd`; CouldNotRun with the error as `subprocess` words it."""
    if cwd is None:
        return _spawn_here(argv, env, actions, group)
    # posix_spawn has no directory argument: the child inherits ours, changed for the spawn and back
    # (agent-fsm spawns from one thread).
    here = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            os.chdir(cwd)
        except OSError as exc:
            raise CouldNotRun(argv, str(exc), exc) from None
        try:
            return _spawn_here(argv, env, actions, group)
        finally:
            os.fchdir(here)
    finally:
        os.close(here)


def _spawn_here(argv: Sequence[str], env: Mapping[str, str], actions: list[tuple[int, ...]],
                group: bool) -> int:
    """Start `argv[0]`, looked up on `env`'s PATH when it names no directory, as `subprocess` does."""
    program = argv[0]
    candidates = ([program] if os.path.dirname(program)
                  else [os.path.join(d, program) for d in os.get_exec_path(dict(env))])
    first: OSError | None = None
    last = OSError(errno.ENOENT, os.strerror(errno.ENOENT))
    for path in candidates:
        if len(candidates) > 1 and not os.path.exists(path):
            continue  # one stat, not a spawn that fails, for each directory without it
        try:
            return os.posix_spawn(path, list(argv), env, file_actions=actions, setsid=group,
                                  setsigdef=_DEFAULT_SIGNALS)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR) and first is None:
                first = exc
            last = exc
    found = first or last
    error = OSError(found.errno, found.strerror, program)
    raise CouldNotRun(argv, str(error), error) from None


def _communicate(argv: Sequence[str], pid: int, out_r: int, err_r: int, in_w: int,
                 data: bytes, timeout: float | None, group: bool, limit: int | None,
                 fds: list[int], on_stderr: Callable[[bytes], None] | None = None
                 ) -> tuple[bytes, bytes]:
    """Feed `data` to `in_w` and read both streams to their end, within `timeout`."""
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    kept = {out_r: 0, err_r: 0}
    reading = [out_r, err_r]
    if in_w >= 0:
        os.set_blocking(in_w, False)
        if not data:
            _close(fds, in_w)
            in_w = -1
    end = None if timeout is None else time.monotonic() + timeout
    while reading or in_w >= 0:
        left = None if end is None else end - time.monotonic()
        if left is not None and left <= 0:
            _kill(pid, group)
            raise CouldNotRun(argv, f"did not finish within {timeout:g}s (killed)")
        readable, writable, _ = select.select(reading, [in_w] if in_w >= 0 else [], [], left)
        if writable:
            try:
                data = data[os.write(in_w, data[:_CHUNK]):]
            except BrokenPipeError:  # it ended, or closed its input, before reading it all
                data = b""
            if not data:
                _close(fds, in_w)
                in_w = -1
        for fd in readable:
            got = os.read(fd, _CHUNK)
            if not got:
                reading.remove(fd)
                continue
            if fd == err_r and on_stderr is not None:
                on_stderr(got)
            if limit is None or kept[fd] < limit:
                chunks[fd].append(got)
                kept[fd] += len(got)
    return b"".join(chunks[out_r]), b"".join(chunks[err_r])


def _kill(pid: int, group: bool) -> None:
    """Kill the command (its whole session with `group`) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        if group:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    _reap(pid)


def _reap(pid: int) -> int:
    while True:
        try:
            return os.waitpid(pid, 0)[1]
        except ChildProcessError:
            return 0  # reaped elsewhere (a SIGCHLD handler that waits for any child)
        except InterruptedError:
            continue


def _text(data: bytes) -> str:
    """Output as text, with universal newlines; bytes that are not UTF-8 become U+FFFD."""
    return data.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
