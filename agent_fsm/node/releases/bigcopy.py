"""A large file's copy for `tree.copy`. The kernel copies the bytes (`copy_file_range`, as `cp`
does), and another thread hashes the new file. So copying and hashing overlap: both release the
GIL, and so does OpenSSL's SHA-256 on large buffers. The store's copy (`stored`) hashes each file a
stretch behind its copy, since it links the file by its hash at once. A payload's copy (`handed`)
goes on to the next files while up to two workers hash the copied ones (`Hashers`).

The hash is of the bytes stored. The new file is in a directory only its owner may enter, so no
other process writes it meanwhile. Where the kernel cannot copy between the two files (another file
system type, an old kernel), the bytes are read and written a MiB at a time and hashed the same way.
Memory: a MiB for each hashing thread's reads, one more for the fallback.
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

    def step(start: int, end: int) -> bool:
        hasher.todo.put((start, end))
        return hasher.failed is None

    try:
        size = _pump(src, out, most, counted, step)
    finally:
        hasher.todo.put(None)
        hasher.join()
    if hasher.failed is not None:
        raise hasher.failed
    return hasher.hash.hexdigest(), size


def _pump(src: int, out: int, most: int, counted: Callable[[int], None],
          step: Callable[[int, int], bool] = lambda _start, _end: True) -> int:
    """Copy `src` to `out` as `copy` does; the bytes copied. `step(start, end)` is told each stretch
    copied, and stops the copy when it answers False."""
    size = 0
    kernel = True
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
            return size
        start, size = size, size + n
        going = step(start, size)
        counted(n)
        if not going:
            return size


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


def _counter(reader: Reader, rel: str) -> tuple[int, Callable[[int], None]]:
    """The most bytes `rel` may still have, and the `counted` that refuses it past `reader`'s
    limits."""
    copied = 0

    def counted(n: int) -> None:
        nonlocal copied
        copied += n
        reader.total += n
        if copied > reader.file_bytes:
            reader.too_big(rel)
        if reader.total > reader.release_bytes:
            reader.too_many_bytes()

    return min(reader.file_bytes, reader.release_bytes - reader.total), counted


def stored(reader: Reader, dir_fd: int, name: str, st: os.stat_result, rel: str,
           target: str, mode: int, flags: int) -> tuple[str, int]:
    """Copy the file `rel` (`name` in `dir_fd`, lstat `st` when walked) to the new file `target`
    (opened with `flags`) with `mode`, within `reader`'s limits. Returns the hash and size stored."""
    fd = reader.open(dir_fd, name, st, rel)
    try:
        out = os.open(target, flags & ~os.O_WRONLY | os.O_RDWR, 0o600)  # read back too
        try:
            done = copy(fd, out, *_counter(reader, rel))
            os.fchmod(out, mode)
        finally:
            os.close(out)
    finally:
        os.close(fd)
    return done


Done = Callable[[str, int, os.stat_result], None]  # given a copy's hash, size and stat


def handed(reader: Reader, dir_fd: int, name: str, st: os.stat_result, rel: str,
           target: str, mode: int, flags: int, hashers: Hashers, done: Done) -> int:
    """Copy the file as `stored` does, and hand the copy to `hashers`, which give `done` its hash,
    size and stat when hashed. Returns the size stored."""
    fd = reader.open(dir_fd, name, st, rel)
    try:
        out = os.open(target, flags & ~os.O_WRONLY | os.O_RDWR, 0o600)  # read back too
        try:
            size = _pump(fd, out, *_counter(reader, rel))
            os.fchmod(out, mode)
            now = os.fstat(out)
        except BaseException:
            os.close(out)
            raise
    finally:
        os.close(fd)
    hashers.put(out, size, lambda sha: done(sha, size, now))
    return size


WORKERS = 2  # threads hashing a payload's copied files: one per core of a small node
PENDING = 8  # copied files waiting for a worker (each an open descriptor)


class Hashers:
    """Hashes copied files on up to WORKERS threads while the copy goes on; at most PENDING wait.

    Used as a context. When the block ends, the workers hash what waits and are joined. When it
    raised, they are stopped first, closing what waits unhashed. A worker's error is raised at the
    next `put` or when the block ends, and stops the others too."""

    def __init__(self) -> None:
        self._todo: queue.Queue[tuple[int, int, Callable[[str], None]] | None] = queue.Queue(
            PENDING)
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self.failed: BaseException | None = None

    def put(self, fd: int, size: int, done: Callable[[str], None]) -> None:
        """Hash the first `size` bytes of the open file `fd`, close it, and give `done` the hash.
        Waits while PENDING files wait."""
        if self.failed is not None:
            os.close(fd)
            raise self.failed
        if len(self._threads) < WORKERS:
            thread = threading.Thread(target=self._run, name="agent-fsm-hash", daemon=True)
            thread.start()
            self._threads.append(thread)
        try:
            self._todo.put((fd, size, done))
        except BaseException:  # interrupted while waiting
            os.close(fd)
            raise

    def _run(self) -> None:
        view = memoryview(bytearray(_READ))
        while (job := self._todo.get()) is not None:
            fd, size, done = job
            try:
                if not self._stop.is_set():
                    done(hashed(fd, size, view))
            except BaseException as exc:  # raised by the copying thread
                if self.failed is None:
                    self.failed = exc
                self._stop.set()
            finally:
                os.close(fd)

    def __enter__(self) -> Hashers:
        return self

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if exc is not None:
            self._stop.set()
        for _ in self._threads:
            self._todo.put(None)  # after what waits: the stopped workers close it
        for thread in self._threads:
            thread.join()
        if exc is None and self.failed is not None:
            raise self.failed


def hashed(fd: int, size: int, view: memoryview) -> str:
    """The SHA-256 of the first `size` bytes of `fd`, read into `view` from its start."""
    h = sha256()
    start = 0
    while start < size:
        n = os.preadv(fd, [view[:min(len(view), size - start)]], start)
        if n == 0:
            raise OSError(errno.EIO, "the new copy is shorter than what was written")
        h.update(view[:n])  # type: ignore[arg-type]
        start += n
    return h.hexdigest()
