"""The writers' lock: an exclusive flock(2) on a lock file beside what it guards, taken through
filelock's `UnixFileLock` (the package the design specifies).

Every agent-fsm takes the same flock on the same file (builds that called flock(2) directly
too), so during an upgrade the last-good's and the candidate's processes exclude each other
whichever version each one is. The lock file is never removed (removing it would let two
processes lock two different files: filelock keeps it since 3.29.5, and `preserve_lock_file`
holds it to that); a process that dies holding it releases it with its descriptor.

`UnixFileLock`, never the `FileLock` alias, with `fallback_to_soft=False`: on a platform or a
filesystem without flock the lock fails with that OSError instead of turning into a marker file
that another release's flock would not see. (These options came in 3.30.0; 3.29 drops options
it does not know without a word, hence the floor in pyproject.toml.) filelock opens with
O_NOFOLLOW (a planted symlink fails, ELOOP, refused here by name) and creates the file with the
mode asked; the check it runs once it holds the lock (`on_acquired`, on the locked descriptor)
refuses anything but a regular file and gives an existing file exactly that mode.
Imported when a lock is taken: readers (`status`) take none and never import filelock. It is
imported without OpenSSL (`_filelock`).
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
    """filelock, imported with `_hashlib` kept out. filelock imports `secrets`, whose `hmac`
    would map OpenSSL's libcrypto: 3.5 MB of an idle daemon's memory, for no digest the lock
    computes. `hmac` and `hashlib`, if this is their first import, then use CPython's own
    digests; `sha256` still finds OpenSSL when something loads it later."""
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
    """Run on the locked descriptor: a regular file, given exactly `mode` whatever the umask (or
    one made before it was kept so); raising lets the lock go again."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise files.unsafe(path, "it is not a regular file")
    if stat.S_IMODE(st.st_mode) != mode:
        os.fchmod(fd, mode)


@contextlib.contextmanager
def held(path: Path, timeout: float, mode: int = 0o600,
         stopping: Callable[[], bool] | None = None) -> Iterator[None]:
    """Hold the lock on `path` for the block; LockTimeout after `timeout` seconds of waiting,
    StopRequested as soon as `stopping()` says a stop came while waiting (the daemon's SIGTERM
    flag: its handler only sets it), DiskError (the path, the errno's words, the fix) when the
    file cannot be opened or fixed."""
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
