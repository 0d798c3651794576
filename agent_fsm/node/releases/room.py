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
