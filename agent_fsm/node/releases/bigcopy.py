"""A large file's copy for `tree.copy`. The kernel copies the bytes (`copy_file_range`, as `cp`
does), and a second thread hashes the new file a stretch behind the copy. So copying and hashing
overlap: both release the GIL, and so does OpenSSL's SHA-256 on large buffers.

The hash is of the bytes stored. The new file is in a directory only its owner may enter, so no
other process writes it meanwhile. Where the kernel cannot copy between the two files (another file
system type, an old kernel), the bytes are read and written a MiB at a time and hashed the same way.
Memory: a MiB for the hash's reads, one more for the fallback.
"""

from __future__ import annotations

import errno
import os
import queue
import threading
from collections.abc import Callable
from typing import NoReturn, Protocol

from ..sha256 import sha256

STRETCH = 16 << 20  # copied per step; the hash follows one step behind
_READ = 1 << 20
_NO_KERNEL_COPY = (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)


class Reader(Protocol):
    """What `stored` needs of `tree.Reader`: its open, its count and its limits."""

    total: int
    file_bytes: int
    release_bytes: int

    def open(self, dir_fd: int, name: str, st: os.stat_result, rel: str) -> int: ...

    def too_big(self, rel: str) -> NoReturn: ...

    def too_many_bytes(self) -> NoReturn: ...


class _Hasher(threading.Thread):
    """Hashes stretches of `fd` as they are queued, in order, into a bytearray of its own."""

    def __init__(self, fd: int) -> None:
        super().__init__(name="agent-fsm-hash", daemon=True)
        self.fd = fd
        self.todo: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()
        self.hash = sha256()
        self.failed: BaseException | None = None

    def run(self) -> None:
        buf = bytearray(_READ)
        view = memoryview(buf)
        try:
            while (job := self.todo.get()) is not None:
                start, end = job
                while start < end:
                    n = os.preadv(self.fd, [view[:min(_READ, end - start)]], start)
                    if n == 0:
                        raise OSError(errno.EIO, "the new copy is shorter than what was written")
                    self.hash.update(view[:n])  # type: ignore[arg-type]
                    start += n
        except BaseException as exc:  # handed to the copying thread, which raises it
            self.failed = exc
            while self.todo.get() is not None:  # drain: the copy goes on until it ends
                pass


def copy(src: int, out: int, most: int, counted: Callable[[int], None]) -> tuple[str, int]:
    """Copy the open file `src` from its start to the new empty file `out`; the SHA-256 and count of
    the bytes written. At most `most` + 1 bytes are copied: `counted(n)` gets each step's bytes
    before the next, and raises over a limit."""
    hasher = _Hasher(out)
    hasher.start()
    size = 0
    kernel = True
    try:
        while True:
            want = min(STRETCH, most - size + 1)
            if kernel:
                try:
                    n = os.copy_file_range(src, out, want)
                except OSError as exc:
                    if size or exc.errno not in _NO_KERNEL_COPY:
                        raise
                    kernel = False
                    continue
            else:
                n = _read_write(src, out, want)
            if n == 0:
                break
            hasher.todo.put((size, size + n))
            size += n
            counted(n)
            if hasher.failed is not None:
                break
    finally:
        hasher.todo.put(None)
        hasher.join()
    if hasher.failed is not None:
        raise hasher.failed
    return hasher.hash.hexdigest(), size


def _read_write(src: int, out: int, want: int) -> int:
    """Read up to `want` bytes of `src` and write them to `out`, a MiB at a time; how many."""
    done = 0
    while done < want:
        chunk = os.read(src, min(_READ, want - done))
        if not chunk:
            break
        view = memoryview(chunk)
        while view:
            view = view[os.write(out, view):]
        done += len(chunk)
    return done


def stored(reader: Reader, dir_fd: int, name: str, st: os.stat_result, rel: str,
           target: str, mode: int, flags: int) -> tuple[str, int]:
    """Copy the file `rel` (`name` in `dir_fd`, lstat `st` when walked) to the new file `target`
    (opened with `flags`) with `mode`, within `reader`'s limits. Returns the hash and size stored."""
    fd = reader.open(dir_fd, name, st, rel)
    try:
        out = os.open(target, flags & ~os.O_WRONLY | os.O_RDWR, 0o600)  # read back too
        try:
            copied = 0

            def counted(n: int) -> None:
                nonlocal copied
                copied += n
                reader.total += n
                if copied > reader.file_bytes:
                    reader.too_big(rel)
                if reader.total > reader.release_bytes:
                    reader.too_many_bytes()

            most = min(reader.file_bytes, reader.release_bytes - reader.total)
            done = copy(fd, out, most, counted)
            os.fchmod(out, mode)
        finally:
            os.close(out)
    finally:
        os.close(fd)
    return done
