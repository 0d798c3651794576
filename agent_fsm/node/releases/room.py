"""Whether a release fits the disk of the store, told before a byte of it is copied.

An add needs the bytes of the release not in the store already (`objects` keeps identical
bytes once), each file rounded up to whole blocks, and a directory a block. It may take what is
free on the state dir's file system for unprivileged writers (`statvfs`'s `f_bavail`) less a
reserve the way back keeps for its state files, journal and kept assets: RESERVE_MIN, or
RESERVE_SHARE of the file system up to RESERVE_MAX, whichever is larger. The quick sum of the
tree's sizes decides when it fits; when it does not, the files are hashed to leave out the ones
the store holds, and the add is refused only if it still does not fit (`NoRoom`)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import NamedTuple

from ...errors import NoRoom
from ..store_config import StoreConfig, size_text
from .objects import OBJECTS, name
from .tree import Footprint, footprint

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
        """The one-line refusal of an add of `what` that needs `need` bytes (`so_far`: at
        least, as far as it was read)."""
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


def check(src: Path, releases_dir: Path, limits: StoreConfig, what: str) -> Footprint:
    """Refuse (NoRoom, one line) to copy the release directory `src` into the store when it
    does not fit (see the module's docstring); `what` names it. The ceilings of `limits` are
    checked on the way (BadTree), before anything is copied. Its footprint, all of it."""
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
    """The one-line error of an add of `what` whose disk (the state dir `where`'s) filled while
    it was copied, from the OSError or the DiskError raised; None for any other error."""
    cause = exc if isinstance(exc, OSError) else exc.__cause__
    if not isinstance(cause, OSError) or cause.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    return NoRoom(f"could not store {what}: the disk of {where} filled while it was copied "
                  f"({cause.strerror}); nothing was stored and its copy was removed; {PRUNE}")
