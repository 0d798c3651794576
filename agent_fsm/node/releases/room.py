"""Whether a release fits the store's disk, told before a byte is copied.

An add needs the bytes the store lacks (`objects` keeps identical bytes once), each file rounded up
to whole blocks, a directory one block. It may take what is free to unprivileged writers (`statvfs`
`f_bavail`) less the reserve the way back keeps for its state files, journal and kept assets. The
reserve is the larger of RESERVE_MIN and RESERVE_SHARE of the file system, at most RESERVE_MAX. The
quick sum of sizes decides when it fits. Otherwise the files are hashed to leave out what the store
holds, and the add is refused (`NoRoom`) only if it still does not fit.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from ...errors import NoRoom
from ..sha256 import sha256
from ..store_config import StoreConfig, size_text
from .objects import OBJECTS, name
from .tree import Reader, normal_mode, open_root, walk

RESERVE_MIN = 64 << 20
RESERVE_MAX = 1 << 30
RESERVE_SHARE = 0.01
PRUNE = "free space or prune: `agent-fsm release prune`"


class Room(NamedTuple):
    """What is free on the file system of `where` (the state dir), and what it keeps."""

    where: Path
    free: int
    reserve: int
    block: int

    def refuse(self, what: str, need: int, *, so_far: bool = False) -> NoRoom:
        """The one-line refusal of an add of `what` that needs `need` bytes (`so_far`: at least, as
        far as it was read)."""
        needs = f"needs {'at least ' if so_far else ''}{size_text(need)}"
        return NoRoom(f"{what} {needs}; {self.where} has {size_text(self.free)} "
                      f"free and keeps {size_text(self.reserve)} for the way back; {PRUNE}; "
                      "nothing was stored")

    def fits(self, need: int) -> bool:
        return need + self.reserve <= self.free


def room(releases_dir: Path) -> Room:
    """The room on the file system of the state dir that holds `releases_dir`, now."""
    st = os.statvfs(releases_dir)
    block = st.f_frsize or 4096
    share = int(st.f_blocks * block * RESERVE_SHARE)
    return Room(releases_dir.parent, st.f_bavail * block,
                max(RESERVE_MIN, min(share, RESERVE_MAX)), block)


class Footprint(NamedTuple):
    disk: int  # the bytes a copy takes on disk (see `footprint`)
    files: int  # its regular files
    bytes: int  # their bytes


def footprint(src: Path, limits: StoreConfig, block: int,
              stored: Callable[[str, int, int], bool] | None = None) -> Footprint:
    """The bytes a copy of the release directory `src` takes on disk: each file rounded up to whole
    `block`s, a directory one block. BadTree over a ceiling of `limits`. Reads only stat, unless
    `stored` is given. Then each file is hashed and left out when `stored(sha, mode, size)` or when
    already met in `src`. Returns also the count and bytes of all its files."""
    src_fd = open_root(src, follow=True)
    total, seen, reader, count = 0, set(), Reader(src, limits), 0
    try:
        for rel, dir_fd, name, st in walk(src_fd, src, stored=False, limits=limits):
            size = 0 if stat.S_ISDIR(st.st_mode) else st.st_size
            count += 0 if stat.S_ISDIR(st.st_mode) else 1
            if size > limits.max_file_bytes:
                reader.too_big(rel)
            reader.total += size
            if reader.total > limits.max_release_bytes:
                reader.too_many_bytes()
            if stored is not None and size:
                key = (_hash(reader.chunks(dir_fd, name, st, rel, again=True))[0],
                       normal_mode(st), size)
                if key in seen or stored(*key):
                    continue
                seen.add(key)
            total += max(-(-size // block), 1) * block
    finally:
        os.close(src_fd)
    return Footprint(total, count, reader.total)



def _hash(chunks: Iterator[bytes]) -> tuple[str, int]:
    h, size = sha256(), 0
    for chunk in chunks:
        h.update(chunk)
        size += len(chunk)
    return h.hexdigest(), size



def check(src: Path, releases_dir: Path, limits: StoreConfig, what: str) -> Footprint:
    """Refuse (NoRoom, one line) to copy the release directory `src` into the store when it does not
    fit; `what` names it. `limits` are checked on the way (BadTree), before anything is copied.
    Returns its whole footprint."""
    space = room(releases_dir)
    whole = footprint(src, limits, space.block)
    if space.fits(whole.disk):
        return whole
    objects = releases_dir / OBJECTS

    def stored(sha: str, mode: int, size: int) -> bool:
        try:
            return os.stat(objects / name(sha, mode)).st_size == size
        except OSError:
            return False

    need = footprint(src, limits, space.block, stored).disk
    if not space.fits(need):
        raise space.refuse(what, need)
    return whole


def filled(exc: BaseException, what: str, where: Path) -> NoRoom | None:
    """The one-line error of an add of `what` whose disk (the state dir `where`'s) filled during the
    copy, from the OSError or DiskError raised. None for any other error."""
    cause = exc if isinstance(exc, OSError) else exc.__cause__
    if not isinstance(cause, OSError) or cause.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    return NoRoom(f"could not store {what}: the disk of {where} filled while it was copied "
                  f"({cause.strerror}); nothing was stored and its copy was removed; {PRUNE}")
