"""Atomic, durable, link-safe file writes: the one way agent-fsm puts bytes on disk.

A write goes to a temporary file in the same directory, is fsynced, renamed over the target, and
the directory is fsynced, so a reader sees the old file or the new one, never a torn one. An
fsync error is not retried on the same descriptor (the kernel may have dropped the dirty pages
and a second fsync would wrongly succeed): the caller's operation fails and is redone from the
start, with new data, on the next run.

Nothing is written through a symlink: the directory written into is opened with O_NOFOLLOW and
every name is resolved relative to it, a symlink at the target name is refused, and the
temporary file is created with O_EXCL | O_NOFOLLOW.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from .errors import UnsafePath


def _token() -> str:
    """A temporary file's random part: os.urandom, not `secrets` (its hmac loads OpenSSL, 3.6 MB
    of every daemon's memory)."""
    return os.urandom(6).hex()


def unsafe(path: Path, why: str) -> UnsafePath:
    return UnsafePath(f"refusing to write {path}: {why}; nothing was written. Remove or fix it "
                      "and run the command again (`agent-fsm doctor` checks every path)")


def ensure_dir(directory: Path, mode: int = 0o755) -> None:
    """Create `directory` (and parents) if missing; refuse it if it is a symlink."""
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        ensure_dir(directory.parent, mode) if directory.parent != directory else None
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, mode)
            os.chmod(directory, mode)  # exact, whatever the umask
            fsync_dir(directory.parent)  # the new entry survives a power loss
        st = os.lstat(directory)
    if stat.S_ISLNK(st.st_mode):
        raise unsafe(directory, "the directory is a symlink")
    if not stat.S_ISDIR(st.st_mode):
        raise unsafe(directory, "it is not a directory")


@contextlib.contextmanager
def _open_dir(directory: Path, *, create: bool = True) -> Iterator[int]:
    if create:
        ensure_dir(directory)
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise unsafe(directory, "the directory is a symlink") from None
        raise
    try:
        yield fd
    finally:
        os.close(fd)


def fsync_dir(directory: Path) -> None:
    """Make the directory's entries (a rename, a new file) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _refuse_link(dir_fd: int, path: Path) -> None:
    try:
        st = os.lstat(path.name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise unsafe(path, "a symlink is planted there")


def atomic_write(path: Path, data: bytes, mode: int = 0o644, *, create_dir: bool = True) -> None:
    """Replace `path` with `data` and exactly `mode`, atomically and durably. Without
    `create_dir`, a missing directory is FileNotFoundError (and nothing is written)."""
    with _open_dir(path.parent, create=create_dir) as dir_fd:
        _refuse_link(dir_fd, path)
        tmp = f".{path.name}.{_token()}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
        except FileExistsError:
            raise unsafe(path, f"something is planted at the temporary name {tmp}") from None
        try:
            try:
                view = memoryview(data)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
                os.fchmod(fd, mode)  # exact, whatever the umask
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
        os.fsync(dir_fd)


def atomic_symlink(link: Path, target: str) -> None:
    """Point `link` at `target`, switching atomically from any previous target."""
    with _open_dir(link.parent) as dir_fd:
        try:
            st = os.lstat(link.name, dir_fd=dir_fd)
            if not stat.S_ISLNK(st.st_mode):
                raise unsafe(link, "a file that is not a pointer symlink is there")
        except FileNotFoundError:
            pass
        tmp = f".{link.name}.{_token()}.tmp"
        os.symlink(target, tmp, dir_fd=dir_fd)
        try:
            os.replace(tmp, link.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
        os.fsync(dir_fd)


def remove(path: Path) -> bool:
    """Remove `path` durably; return whether it existed."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    fsync_dir(path.parent)
    return True


def read_bytes(path: Path) -> bytes | None:
    """The file's bytes, or None when it does not exist."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of the regular file `path`, read without following a symlink at it and without
    blocking on a FIFO or device. FileNotFoundError when it is missing; ValueError when it is a
    symlink, not a regular file, or larger than `limit` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError("it is a symlink") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("it is not a regular file")
        chunks, size = [], 0  # read in 64 KiB: os.read allocates what it is asked for
        while size <= limit and (chunk := os.read(fd, min(limit + 1 - size, 1 << 16))):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise ValueError(f"it is larger than {limit} bytes")
    return b"".join(chunks)


def ensure_private_dir(directory: Path) -> None:
    """Create `directory` 0700 (its parents 0755) if missing; tighten one of ours that others
    may read or enter to 0700 (no other user needs it, and a readable lock in it lets any user
    block every writer); refuse it (`check_private_dir`) if it is foreign or others may write."""
    ensure_dir(directory.parent)
    ensure_dir(directory, 0o700)
    check_private_dir(directory)
    mode = stat.S_IMODE(os.lstat(directory).st_mode)
    if mode & 0o077:
        os.chmod(directory, 0o700, follow_symlinks=False)
        import logging  # here: only tightening a loose directory logs; `status` need not import it

        logging.getLogger("agent_fsm").warning(
            "state directory %s had mode %04o; tightened to 0700: only agent-fsm uses it",
            directory, mode)


def check_private_dir(directory: Path) -> None:
    """Refuse a state directory that another user owns or that group or others may write."""
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise unsafe(directory, "the state directory is a symlink")
    if st.st_uid != os.geteuid():
        raise UnsafePath(f"state directory {directory} is owned by uid {st.st_uid}, not by "
                         f"agent-fsm's uid {os.geteuid()}; fix with `chown {os.geteuid()} "
                         f"{directory}`")
    if st.st_mode & 0o022:
        raise UnsafePath(f"state directory {directory} has mode {stat.S_IMODE(st.st_mode):04o}: "
                         f"group or others may write it; fix with `chmod go-w {directory}`")
