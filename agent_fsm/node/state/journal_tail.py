"""The journal's tail: its first and last lines and its last bytes, read off a descriptor.

The writer decides how to append from these alone (`journal.Journal.append`), so that an append
costs the same whatever the journal's length.
"""

from __future__ import annotations

import os


def last_line(fd: int, size: int) -> bytes | None:
    """The file's last line without its newline; None if the file does not end with one."""
    chunk = 4096
    while True:
        start = max(size - chunk, 0)
        data = os.pread(fd, size - start, start)
        if not data.endswith(b"\n"):
            return None
        cut = data.rfind(b"\n", 0, len(data) - 1)
        if cut >= 0 or start == 0:
            return data[cut + 1:-1]
        chunk *= 4


def first_line(fd: int, size: int) -> bytes | None:
    """The file's first line without its newline; None if it has no newline."""
    chunk = 4096
    while True:
        data = os.pread(fd, min(chunk, size), 0)
        cut = data.find(b"\n")
        if cut >= 0:
            return data[:cut]
        if len(data) >= size:
            return None
        chunk *= 4


def ends_with(fd: int, lines: bytes) -> bool:
    """Whether the file's last lines are exactly `lines` (whole lines, each with its newline):
    the file ends with those bytes, at its start or just after a newline."""
    size = os.fstat(fd).st_size
    start = size - len(lines)
    if start < 0:
        return False
    if start == 0:
        return os.pread(fd, size, 0) == lines
    return os.pread(fd, len(lines) + 1, start - 1) == b"\n" + lines
