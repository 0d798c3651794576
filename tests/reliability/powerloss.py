"""A power-loss layer under agent-fsm's file writes, for tests.

It lets every operation of `agent_fsm.files` happen for real while it records what is durable:
a file's content once it was fsynced, a directory's entries once the directory was fsynced.
At a chosen operation it stops the run (`Crash`), then `lose_power()` rewrites the tree as a
disk would come back: each directory with only its durable entries, each file with only its
durable content (a new file never fsynced comes back empty), except that a file appended to
since its last fsync keeps half of what was appended: a torn last record, as an append cut
short leaves it, or (`whole_lines`) only the whole lines of that half, as a file system that
lost the unsynced blocks leaves it. A file with several durable names (hard links) comes back
as one file with those names. Directories themselves are kept where the run left them (the
durable entries of a directory follow it when it is renamed): a directory made, renamed or
removed is taken as durable at once, so the store's whole-tree renames are covered as crash
points, not as lost renames.

`ops` are the operations counted as crash points (the store's runs add links, renames and
directories); with `dies`, every operation after the crash raises too, as in a dead process
(no `finally` block gets to clean up). `files.sync_filesystem` (syncfs(2)) makes everything
below root durable.
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
STORE_OPS = (*OPS, "link", "rename", "mkdir", "rmdir", "syncfs")


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
    ops_counted: tuple[str, ...] = OPS
    dies: bool = False  # every operation after the crash raises too
    ops: int = 0
    dirs: dict[int, dict[str, Entry]] = field(default_factory=dict)  # by the directory's inode
    content: dict[int, bytes] = field(default_factory=dict)
    modes: dict[int, int] = field(default_factory=dict)  # a file's mode, as it was made durable

    def __post_init__(self) -> None:
        self._snapshot()  # what is on disk before the run is durable

    def _snapshot(self) -> None:
        """Take everything below root as durable now."""
        for d in [self.root, *[p for p in self.root.rglob("*") if p.is_dir() and not p.is_symlink()]]:
            listing = self.dirs[d.lstat().st_ino] = _listing(d)
            for name, (ino, kind, _) in listing.items():
                if kind == "file":
                    self.content[ino] = (d / name).read_bytes()
                    self.modes[ino] = stat.S_IMODE((d / name).lstat().st_mode)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        wrapped = [name for name in self.ops_counted if name != "syncfs"]
        real = {name: getattr(os, name) for name in wrapped}

        def tick(name: str) -> None:
            self.ops += 1
            if self.crash_at is not None and (
                    self.ops == self.crash_at or (self.dies and self.ops > self.crash_at)):
                raise Crash(name)

        def wrap(name: str) -> Any:
            def op(*args: Any, **kwargs: Any) -> Any:
                tick(name)
                result = real[name](*args, **kwargs)
                if name == "fsync":
                    self._made_durable(args[0])
                return result
            return op

        for name in wrapped:
            monkeypatch.setattr(files.os, name, wrap(name))
        real_sync = files.sync_filesystem

        def sync_filesystem(directory: Path) -> None:  # syncfs(2): all of it durable at once
            if "syncfs" in self.ops_counted:
                tick("syncfs")
            real_sync(directory)
            self._snapshot()

        monkeypatch.setattr(files, "sync_filesystem", sync_filesystem)

    def _made_durable(self, fd: int) -> None:
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            self.dirs[st.st_ino] = _listing(path)
        elif stat.S_ISREG(st.st_mode):
            with open(f"/proc/self/fd/{fd}", "rb") as f:
                self.content[st.st_ino] = f.read()
            self.modes[st.st_ino] = stat.S_IMODE(st.st_mode)

    def lose_power(self) -> None:
        """Rewrite the tree below root as it would come back after the power loss."""
        restored: dict[int, Path] = {}  # a file's inode before the loss -> its first name now
        for d in sorted(p for p in self.root.rglob("*") if p.is_dir() and not p.is_symlink()):
            self._restore(d, restored)
        self._restore(self.root, restored)

    def _restore(self, d: Path, restored: dict[int, Path]) -> None:
        durable = self.dirs.get(d.lstat().st_ino, {})
        now = _listing(d)
        current = {ino: (d / name).read_bytes() for name, (ino, kind, _) in now.items()
                   if kind == "file"}
        for name in now:
            (d / name).unlink()
        for name, (ino, kind, target) in durable.items():
            if kind == "link":
                (d / name).symlink_to(target)
            elif ino in restored:
                os.link(restored[ino], d / name)
            else:
                (d / name).write_bytes(_torn(self.content.get(ino, b""), current.get(ino),
                                             self.whole_lines))
                if ino in self.modes:
                    os.chmod(d / name, self.modes[ino])
                restored[ino] = d / name
