"""Changes to a directory's entries, from the kernel's inotify (through ctypes: no dependency).

`DirWatch.fd` is readable once an entry was written and closed, created, moved or removed; `changed`
reads what came. A process waits on it beside its other descriptors and wakes only when something
happens.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

IN_CLOSE_WRITE = 0x008
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_IGNORED = 0x8000
CHANGES = (IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
           | IN_DELETE_SELF | IN_MOVE_SELF)
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)


class DirWatch:
    """One directory watched; `gone` once the directory itself was removed or moved."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.gone = False

    @classmethod
    def open(cls, directory: Path) -> DirWatch | None:
        """A watch on `directory`; None where the kernel or libc gives none."""
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        except (OSError, AttributeError):
            return None
        if fd < 0:
            return None
        if libc.inotify_add_watch(fd, os.fsencode(directory), CHANGES) < 0:
            os.close(fd)
            return None
        return cls(fd)

    def changed(self) -> bool:
        """Read the events that came; whether any did."""
        seen = False
        while True:
            try:
                data = os.read(self.fd, 4096)
            except BlockingIOError:
                return seen
            if not data:
                return seen
            seen = True
            offset = 0
            while offset + _EVENT.size <= len(data):
                _wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                if mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF):
                    self.gone = True
                offset += _EVENT.size + length

    def close(self) -> None:
        os.close(self.fd)
