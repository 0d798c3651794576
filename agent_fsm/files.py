"""Atomic, durable file writes: the one way agent-fsm puts bytes on disk.

A write goes to a temporary file in the same directory, is fsynced, renamed over the target, and
the directory is fsynced, so a reader sees the old file or the new one, never a torn one. An
fsync error is not retried on the same descriptor (the kernel may have dropped the dirty pages
and a second fsync would wrongly succeed): the caller's operation fails and is redone from the
start, with new data, on the next run.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Make the directory's entries (a rename, a new file) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace `path` with `data` and exactly `mode`, atomically and durably."""
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{path.name}.{secrets.token_hex(6)}.tmp"
    # O_EXCL and O_NOFOLLOW: never write through a planted file or link at the temporary name.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
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
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    fsync_dir(directory)


def atomic_symlink(link: Path, target: str) -> None:
    """Point `link` at `target`, switching atomically from any previous target."""
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.parent / f".{link.name}.{secrets.token_hex(6)}.tmp"
    os.symlink(target, tmp)
    try:
        os.replace(tmp, link)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    fsync_dir(link.parent)


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
