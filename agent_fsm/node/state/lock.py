"""The writers' lock: an exclusive flock(2) on a lock file beside what it guards.

Every agent-fsm takes it the same way — earlier releases through the `filelock` package, which
on Linux is this same flock(2) on the same file — so during an upgrade the last-good's and the
candidate's processes exclude each other whichever version each one is. The lock file is never
removed (removing it would let two processes lock two different files); a process that dies
holding it releases it with its descriptor.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from ... import files
from ...errors import LockTimeout

# First re-try soon (a transition holds the lock for about a millisecond), then every 50 ms.
_FIRST_WAIT = 0.001
_MAX_WAIT = 0.05


def _open(path: Path, mode: int) -> int:
    """The lock file open for locking, created with exactly `mode`; a symlink planted there or
    anything but a regular file is refused, and an existing file is given `mode`."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                     | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise files.unsafe(path, "a symlink is planted there") from None
        if exc.errno == errno.EISDIR:
            raise files.unsafe(path, "it is not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise files.unsafe(path, "it is not a regular file")
        if stat.S_IMODE(st.st_mode) != mode:
            os.fchmod(fd, mode)  # exact whatever the umask, or one made before it was kept so
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def held(path: Path, timeout: float, mode: int = 0o600) -> Iterator[None]:
    """Hold the lock on `path` for the block; LockTimeout after `timeout` seconds of waiting."""
    fd = _open(path, mode)
    try:
        wait, deadline = _FIRST_WAIT, time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise LockTimeout(str(path)) from None
                time.sleep(min(wait, left))
                wait = min(wait * 2, _MAX_WAIT)
        yield
    finally:
        os.close(fd)  # closing the only descriptor releases the lock
