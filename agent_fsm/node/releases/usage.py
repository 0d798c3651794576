"""What the store takes on disk, and what removing releases would give back.

Bytes are on disk (`st_blocks`, as `du` counts). A file is one inode whatever its names (`objects`).
An inode one release holds is its own; one two or more hold is shared, counted once. Directories are
their release's own. Only stat is read, but a walk is slow for `status` (~130 ms for two releases of
20,000 files). So each add and prune records the figures in `releases/.usage` (`record`), and
`status` reads them while the stored versions match (`seen`). Free space is always read live.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from ... import files
from ..store_config import size_text
from .objects import OBJECTS
from .room import room

_Inode = tuple[int, int]
USAGE = ".usage"
HEADER = b"agent-fsm store usage v1\n"
_MAX_RECORD = 1 << 20


class StoreBytes(NamedTuple):
    """The store's bytes on disk: each release's own and the shared ones (once). Also the room left
    on the state dir's file system, with the reserve the way back keeps (`room`)."""

    releases: dict[str, int]  # version: bytes of the files and directories only it holds
    shared: int  # bytes of the files two or more releases hold, each file once
    free: int  # free on the state dir's file system (`statvfs` f_bavail)
    reserve: int  # what an add leaves free for the way back (`room.Room.reserve`)

    @property
    def total(self) -> int:
        return sum(self.releases.values()) + self.shared

    @property
    def short(self) -> bool:
        """Whether less is free than the way back keeps: adds are refused, and the state
        files, journal and kept assets may not be written."""
        return self.free < self.reserve

    def words(self) -> str:
        """`1.2 GiB (3 releases, 140 MiB shared), 40 GiB free`, and the shortfall if any."""
        n = len(self.releases)
        said = (f"{size_text(self.total)} ({n} release{'' if n == 1 else 's'}, "
                f"{size_text(self.shared)} shared), {size_text(self.free)} free")
        if self.short:
            said += (f", below the {size_text(self.reserve)} the way back keeps: adds are "
                     "refused and the way back's own writes may fail")
        return said

    def to_json(self) -> dict[str, Any]:
        return {"total_bytes": self.total, "release_bytes": dict(self.releases),
                "shared_bytes": self.shared, "free_bytes": self.free,
                "reserve_bytes": self.reserve}


def _tree(top: str) -> Iterator[os.stat_result]:
    """The lstat of the directory `top` and of every entry below it, nothing followed."""
    with contextlib.suppress(OSError):
        yield os.lstat(top)
        yield from _entries(top)


def _entries(top: str) -> Iterator[os.stat_result]:
    """The lstat of every entry below `top`, nothing followed."""
    try:
        it = os.scandir(top)
    except OSError:
        return
    with it:
        for e in it:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            yield st
            if stat.S_ISDIR(st.st_mode):
                yield from _entries(e.path)


def _versions(releases_dir: Path) -> list[str]:
    try:
        with os.scandir(releases_dir) as it:
            return sorted(e.name for e in it
                          if not e.name.startswith(".") and e.is_dir(follow_symlinks=False))
    except FileNotFoundError:
        return []


class _Held(NamedTuple):
    size: int  # bytes on disk
    trees: set[str]  # the trees holding it
    names: int  # its names in those trees
    links: int  # its names anywhere (a directory: 1, it is never shared)


def holders(trees: Iterable[tuple[str, Path]]) -> dict[_Inode, _Held]:
    """Each inode below the named trees, with who holds it, each inode once."""
    seen: dict[_Inode, _Held] = {}
    for label, tree in trees:
        for st in _tree(str(tree)):
            ino = (st.st_dev, st.st_ino)
            known = seen.get(ino)
            if known is None:
                links = 1 if stat.S_ISDIR(st.st_mode) else st.st_nlink
                seen[ino] = _Held(st.st_blocks * 512, {label}, 1, links)
            else:
                known.trees.add(label)
                seen[ino] = known._replace(names=known.names + 1)
    return seen


def _walked(releases_dir: Path, versions: list[str]) -> tuple[dict[str, int], int]:
    """Each release's own bytes and the shared ones, by a stat walk of each release."""
    own = dict.fromkeys(versions, 0)
    shared = 0
    for held in holders((v, releases_dir / v) for v in versions).values():
        if len(held.trees) > 1:
            shared += held.size
        else:
            own[next(iter(held.trees))] += held.size
    return own, shared


def _with_room(releases_dir: Path, own: dict[str, int], shared: int) -> StoreBytes:
    where = releases_dir  # the store's, or where it will be: the state dir's file system
    while not where.is_dir() and where != where.parent:
        where = where.parent
    space = room(where)
    return StoreBytes(own, shared, space.free, space.reserve)


def store_bytes(releases_dir: Path) -> StoreBytes:
    """The store's bytes now, walked (see the module's docstring)."""
    return _with_room(releases_dir, *_walked(releases_dir, _versions(releases_dir)))


class Disk:
    """The bytes on disk of one tree as its entries' lstat come (`add`), each inode once: a file
    with more than two names (its object's and one) is counted at its first."""

    def __init__(self, top: os.stat_result) -> None:
        self.bytes = top.st_blocks * 512
        self._linked: set[int] = set()  # such files' inodes

    def add(self, st: os.stat_result) -> None:
        if st.st_nlink > 2 and not stat.S_ISDIR(st.st_mode):
            if st.st_ino in self._linked:
                return
            self._linked.add(st.st_ino)
        self.bytes += st.st_blocks * 512


def record(releases_dir: Path, locked: Callable[[], contextlib.AbstractContextManager[object]],
           added: tuple[str, int | None] | None = None) -> None:
    """Record the store's bytes for `seen` after an add or prune: walked without the writers' lock,
    written under it (`locked()`). `added`, a release just stored and its bytes if known (`Disk`):
    when it is the only one, its bytes are all its own and nothing is walked. A text record: its header,
    `shared <bytes>`, then one `release <bytes> <version>` each. Written only when the figures
    changed: a refused add writes nothing."""
    versions = _versions(releases_dir)
    if added is not None and added[1] is not None and versions == [added[0]]:
        own, shared = {added[0]: added[1]}, 0
    else:
        own, shared = _walked(releases_dir, versions)
    if (own, shared) == (_recorded(releases_dir) or ({}, 0)):
        return
    lines = [HEADER, f"shared {shared}\n".encode()]
    lines += [f"release {n} {v}\n".encode() for v, n in own.items()]
    with locked():
        files.atomic_write(releases_dir / USAGE, b"".join(lines), 0o644)


def _recorded(releases_dir: Path) -> tuple[dict[str, int], int] | None:
    """The record's figures; None when there is none or it is not one."""
    try:
        data = files.read_regular(releases_dir / USAGE, _MAX_RECORD)
        if not data.startswith(HEADER):
            return None
        rows = [line.split(" ", 2) for line in data[len(HEADER):].decode().splitlines()]
        shared = int(rows[0][1]) if rows and rows[0][0] == "shared" and len(rows[0]) == 2 \
            else -1
        own = {r[2]: int(r[1]) for r in rows[1:] if len(r) == 3 and r[0] == "release"}
    except (OSError, ValueError):
        return None
    if shared < 0 or len(own) != len(rows) - 1 or any(n < 0 for n in own.values()):
        return None
    return own, shared


def seen(releases_dir: Path) -> StoreBytes:
    """The store's bytes as recorded at the last add or prune while the stored versions are those
    recorded, else walked now. Writes nothing: `status` reads without the lock."""
    versions = _versions(releases_dir)
    known = _recorded(releases_dir)
    if known is not None and sorted(known[0]) == versions:
        return _with_room(releases_dir, *known)
    return _with_room(releases_dir, *_walked(releases_dir, versions))


def freed_by(trees: Iterable[Path], releases_dir: Path) -> int:
    """The bytes that deleting `trees` (stored releases, or trees taken out) and then collecting
    unlinked objects (`objects.collect`) gives back. That is each inode whose names are all in
    `trees` but its object's, and each object no release links now. A file linked from outside
    `trees` frees nothing."""
    objects: dict[int, tuple[int, int]] = {}  # inode: links and bytes, of each object
    try:
        with os.scandir(releases_dir / OBJECTS) as it:
            for e in it:
                with contextlib.suppress(OSError):
                    st = e.stat(follow_symlinks=False)
                    objects[st.st_ino] = (st.st_nlink, st.st_blocks * 512)
    except FileNotFoundError:
        pass
    total = sum(size for links, size in objects.values() if links == 1)
    for (_, ino), h in holders((str(t), t) for t in trees).items():
        rest = h.links - h.names
        if rest == 0 or (rest == 1 and ino in objects):
            total += h.size
    return total
