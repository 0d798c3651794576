"""A power-loss layer under agent-fsm's file writes, for tests.

It lets every operation of `agent_fsm.files` happen for real while it records what is durable:
a file's content once it was fsynced, a directory's entries once the directory was fsynced.
At a chosen operation it stops the run (`Crash`), then `lose_power()` rewrites the tree as a
disk would come back: each directory with only its durable entries, each file with only its
durable content (a new file never fsynced comes back empty), except that a file appended to
since its last fsync keeps half of what was appended: a torn last record, as an append cut
short leaves it, or (`whole_lines`) only the whole lines of that half, as a file system that
lost the unsynced blocks leaves it. Directories themselves are kept.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agent_fsm import files

OPS = ("write", "fchmod", "fsync", "replace", "unlink", "symlink")


class Crash(BaseException):
    """The power went out."""


Entry = tuple[int, str, str]  # inode, "file" | "link", link target


def _listing(directory: Path) -> dict[str, Entry]:
    out: dict[str, Entry] = {}
    with os.scandir(directory) as it:
        for e in it:
            st = e.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                out[e.name] = (st.st_ino, "link", os.readlink(e.path))
            elif stat.S_ISREG(st.st_mode):
                out[e.name] = (st.st_ino, "file", "")
    return out


def _torn(durable: bytes, current: bytes | None, whole_lines: bool) -> bytes:
    """What comes back of a file: its durable bytes, and half of any unsynced append to them
    (cut after its last newline if `whole_lines`)."""
    if not durable or current is None or not current.startswith(durable):
        return durable
    extra = current[len(durable):]
    half = extra[:len(extra) // 2]
    return durable + (half[:half.rfind(b"\n") + 1] if whole_lines else half)


@dataclass
class PowerLoss:
    root: Path
    crash_at: int | None = None
    whole_lines: bool = False  # an unsynced append comes back as whole lines, not torn
    ops: int = 0
    dirs: dict[Path, dict[str, Entry]] = field(default_factory=dict)
    content: dict[int, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # What is on disk before the run is durable.
        for d in [self.root, *[p for p in self.root.rglob("*") if p.is_dir() and not p.is_symlink()]]:
            self.dirs[d] = _listing(d)
            for name, (ino, kind, _) in self.dirs[d].items():
                if kind == "file":
                    self.content[ino] = (d / name).read_bytes()

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real = {name: getattr(os, name) for name in OPS}

        def wrap(name: str) -> Any:
            def op(*args: Any, **kwargs: Any) -> Any:
                self.ops += 1
                if self.crash_at is not None and self.ops == self.crash_at:
                    raise Crash(name)
                result = real[name](*args, **kwargs)
                if name == "fsync":
                    self._made_durable(args[0])
                return result
            return op

        for name in OPS:
            monkeypatch.setattr(files.os, name, wrap(name))

    def _made_durable(self, fd: int) -> None:
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            self.dirs[path] = _listing(path)
        elif stat.S_ISREG(st.st_mode):
            with open(f"/proc/self/fd/{fd}", "rb") as f:
                self.content[st.st_ino] = f.read()

    def lose_power(self) -> None:
        """Rewrite the tree below root as it would come back after the power loss."""
        for d in sorted(p for p in self.root.rglob("*") if p.is_dir() and not p.is_symlink()):
            self._restore(d)
        self._restore(self.root)

    def _restore(self, d: Path) -> None:
        durable = self.dirs.get(d, {})
        now = _listing(d)
        current = {ino: (d / name).read_bytes() for name, (ino, kind, _) in now.items()
                   if kind == "file"}
        for name in now:
            (d / name).unlink()
        for name, (ino, kind, target) in durable.items():
            if kind == "link":
                (d / name).symlink_to(target)
            else:
                (d / name).write_bytes(_torn(self.content.get(ino, b""), current.get(ino),
                                             self.whole_lines))
