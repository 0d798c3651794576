"""The writers' lock: an exclusive flock(2) on a lock file, through filelock's `UnixFileLock`.

Every agent-fsm version takes the same flock on the same file, so the last-good's and the
candidate's processes exclude each other. The file is never removed (`preserve_lock_file`), or
two processes could lock two files.

`fallback_to_soft=False`: without flock, locking fails rather than making a marker file
(filelock 3.29 ignores unknown options: hence the 3.30 floor). A planted symlink is refused by
name. Once locked, `on_acquired` refuses a non-regular file and sets the exact mode. Readers
never import filelock.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

from ... import files
from ...errors import DiskError, LockTimeout, StopRequested

# First re-try soon (a transition holds the lock for about a millisecond), then every 50 ms.
_FIRST_WAIT = 0.001
_MAX_WAIT = 0.05
_NO_FLOCK = (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP)


def _filelock() -> ModuleType:
    """filelock, imported with `_hashlib` kept out.

    Its `secrets` import would load OpenSSL's libcrypto via `hmac`: 3.5 MB of an idle daemon,
    for no digest. `sha256` still finds OpenSSL if something loads it later.
    """
    if "filelock" in sys.modules or "_hashlib" in sys.modules:
        import filelock

        return filelock
    sys.modules["_hashlib"] = None  # type: ignore[assignment]  # None: import fails, ImportError
    try:
        import filelock
    finally:
        del sys.modules["_hashlib"]
    return filelock


def _checked(path: Path, mode: int, fd: int) -> None:
    """Check the locked descriptor is a regular file and give it exactly `mode`; raising releases it."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise files.unsafe(path, "it is not a regular file")
    if stat.S_IMODE(st.st_mode) != mode:
        os.fchmod(fd, mode)


@contextlib.contextmanager
def held(path: Path, timeout: float, mode: int = 0o600,
         stopping: Callable[[], bool] | None = None) -> Iterator[None]:
    """Hold the lock on `path` for the block.

    LockTimeout after `timeout` seconds; StopRequested as soon as `stopping()` says so (the
    daemon's SIGTERM flag); DiskError when the file cannot be opened or fixed.
    """
    filelock = _filelock()  # writers only
    lock = filelock.UnixFileLock(
        path, mode=mode, fallback_to_soft=False, preserve_lock_file=True,
        on_acquired=lambda fd: _checked(path, mode, fd))
    wait, deadline = _FIRST_WAIT, time.monotonic() + timeout
    while True:
        try:
            lock.acquire(blocking=False)  # our own back-off: filelock polls every 50 ms
            break
        except filelock.Timeout:
            if stopping is not None and stopping():
                raise StopRequested(f"a stop came while waiting for {path}") from None
            left = deadline - time.monotonic()
            if left <= 0:
                raise LockTimeout(str(path)) from None
            time.sleep(min(wait, left))
            wait = min(wait * 2, _MAX_WAIT)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
                raise files.unsafe(path, "a symlink is planted there") from None
            if exc.errno == errno.EISDIR:
                raise files.unsafe(path, "it is not a regular file") from None
            if exc.errno in _NO_FLOCK:
                raise DiskError(f"could not lock {path}: {exc.strerror}; its file system does "
                                "not support flock(2): put the state directory on a local file "
                                "system (`findmnt -T` names it)") from exc
            # A read-only, full or failing file system: opening (O_CREAT) or fixing its mode.
            raise files.disk_error(exc, f"open the writers' lock {path}", path.parent) from exc
    try:
        yield
    finally:
        lock.release()
