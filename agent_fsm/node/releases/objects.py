"""The store's objects: each distinct file of the stored releases kept once, hard-linked into every
release that holds it.

`releases/.objects/<sha256>-<mode>` (mode `644` or `755`) is a regular file of the store's uid,
never writable by others. Its bytes hash to its name. A release directory stays a plain tree (what
`tree.scan` walks and the digest covers), each file one more link to an object. A release with files
of its own reads the same.

An object with link count 1 (only its name here) is garbage. `collect` removes it after each add and
prune, outside the writers' lock. A crash leaves at worst such garbage, freed by the next add or
prune. An add that races `collect` stores its own copy, or keeps the bytes under no name: a file
kept twice, never lost, freed with its release.

Hard links share one inode. A file replaced in one release changes that release only. Bytes written
in place change every release that links it, and `store.check` reports each damaged (the file is
shared). Workloads see the store read-only (`system.confine`), so only a hand or a disk can do that.
The way back repairs its last-good from an intact copy (`repair.repair`). An add never links an
object whose bytes, mode or owner differ from its name. It stores the file anew under that name
instead, so re-adding a damaged release mends it.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from ... import files
from ..sha256 import sha256

OBJECTS = ".objects"
MOVED = ".hashed/.moved"  # a stored file's ctime may have moved since the records' refresh
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_CHUNK = 1 << 16


def moved(releases_dir: Path | str) -> None:
    """Note that a stored file's ctime moved (a name linked or unlinked), so the next tidy refreshes
    the hashes records (`hashes.refresh_hashed`). Written without the lock; a crash in between only
    costs one more hash at the next check."""
    path = f"{releases_dir}/{MOVED}"
    if os.path.lexists(path):
        return
    files.ensure_dir(Path(path).parent)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))


def name(sha: str, mode: int) -> str:
    return f"{sha}-{mode:o}"


class Objects:
    """The objects of one store, for one add: `link` links a staged file to an intact object, `keep`
    makes a staged file the object of its bytes.

    The objects dir is listed once, at the first link, into a filter of the names stored then
    (`Names`); each name `keep` gives goes into another. So a file whose bytes the store lacks costs
    no failed link (one another add stores meanwhile is kept twice: `keep` takes the name, its
    release keeps its file). Linking a name moves the ctime of every name of that file: only a link
    to an object stored before this add notes it (`moved`), since no other is in another release's
    hashes record. (The manifest's scan of the staging copy hashes again the earlier names of a file
    linked twice.)"""

    def __init__(self, releases_dir: Path) -> None:
        self.dir = releases_dir / OBJECTS
        self._base = f"{self.dir}/"
        files.ensure_dir(self.dir, 0o700)
        self._before: Names | None = None
        self.made = Names()  # kept by this add

    @property
    def before(self) -> Names:
        """The names stored before the first link, listed then (`keep` alone lists nothing)."""
        if self._before is None:
            self._before = Names(self.dir)
        return self._before

    def _linked(self, obj: str) -> None:
        """Note a link just made to the object `obj`."""
        if obj in self.before:  # maybe another release's: its ctime moved
            moved(self.dir.parent)

    def link(self, target: Path | str, sha: str, mode: int, size: int) -> os.stat_result | None:
        """Make `target` (a new name in a staging copy) a link to the intact object of these bytes
        and mode, checked through the new link. Returns its stat as checked. None, and no `target`,
        when the object is missing, damaged or freed meanwhile."""
        obj = name(sha, mode)
        if obj not in self.before and obj not in self.made:
            return None  # none when this add began, nor made since
        try:
            os.link(self._base + obj, target)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.EMLINK):  # none, or linked the most it can be
                return None  # (`keep` then gives the name to a new copy)
            raise
        self._linked(obj)
        checked = intact(target, sha, mode, size)
        if checked is None:
            os.unlink(target)
        return checked

    def adopt(self, target: str, sha: str, mode: int, size: int) -> os.stat_result | None:
        """Replace the file written at `target` by a link to the intact object of these bytes and
        mode, checked through a link of its own. Returns its stat as checked. None, `target`
        untouched, when there is no intact object."""
        obj = name(sha, mode)
        if obj not in self.before and obj not in self.made:
            return None
        tmp = self.dir / f".new-{os.urandom(6).hex()}"
        try:
            os.link(self._base + obj, tmp)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.EMLINK):
                return None
            raise
        self._linked(obj)
        checked = None
        try:
            checked = intact(tmp, sha, mode, size)
            if checked is not None:
                os.replace(tmp, target)  # the written copy goes, unread again
        finally:
            if checked is None:
                os.unlink(tmp)
        # A rename moves the ctime: the stat a record keys is the one after it.
        return None if checked is None else os.lstat(target)

    def keep(self, target: Path | str, sha: str, mode: int) -> None:
        """Make the staged file `target` the object of its bytes. A damaged object of that name is
        replaced; releases linking it keep the damaged inode."""
        obj = name(sha, mode)
        self.made.add(obj)
        try:
            os.link(target, self._base + obj)  # the common case: none yet
            return
        except FileExistsError:
            pass
        tmp = self.dir / f".new-{os.urandom(6).hex()}"
        os.link(target, tmp)
        moved(self.dir.parent)  # the damaged object loses a name
        os.replace(tmp, self._base + obj)


class Names:
    """A filter of object names, in a fixed 512 KiB: a name never added is never `in` it; one
    added always is. Another name is `in` it once in a while, as likely as BITS fills up (a
    store of 100,000 objects: one in 40), which costs one failed link."""

    BITS = 1 << 22

    def __init__(self, where: Path | None = None) -> None:
        self.bits = bytearray(self.BITS >> 3)
        if where is not None:
            with os.scandir(where) as it:  # not listed: a store of big releases has 100,000s
                for e in it:
                    self.add(e.name)

    @classmethod
    def _bit(cls, obj: str) -> int:
        try:
            return int(obj[:8], 16) % cls.BITS
        except ValueError:  # not an object's name (`.new-…`): any bit will do
            return 0

    def add(self, obj: str) -> None:
        bit = self._bit(obj)
        self.bits[bit >> 3] |= 1 << (bit & 7)

    def __contains__(self, obj: str) -> bool:
        bit = self._bit(obj)
        return bool(self.bits[bit >> 3] & (1 << (bit & 7)))


def intact(path: Path | str, sha: str, mode: int, size: int) -> os.stat_result | None:
    """The stat of `path` when it is our regular file with this mode and size, its bytes hash to
    `sha`, and it did not change while read whole. Else None."""
    try:
        fd = os.open(path, _READ)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENXIO):
            return None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() \
                or stat.S_IMODE(st.st_mode) != mode or st.st_size != size:
            return None
        h = sha256()
        while chunk := os.read(fd, _CHUNK):
            h.update(chunk)
        after = os.fstat(fd)
        same = (after.st_ctime_ns, after.st_mtime_ns) == (st.st_ctime_ns, st.st_mtime_ns)
        return st if same and h.hexdigest() == sha else None
    finally:
        os.close(fd)


class Collected(NamedTuple):
    files: int = 0
    bytes: int = 0


def collect(releases_dir: Path) -> Collected:
    """Remove every object no release links (link count 1) and what an interrupted `keep` left.
    Needs no lock; the module docstring describes the race with an add."""
    where = releases_dir / OBJECTS
    try:
        entries = os.scandir(where)  # not listed: a store of big releases has 100,000s
    except FileNotFoundError:
        return Collected()
    with entries:
        freed, size = _collect(entries)
    if freed:
        files.fsync_dir(where)
    return Collected(freed, size)


def _collect(entries: Iterator[os.DirEntry[str]]) -> tuple[int, int]:
    """Unlink the garbage among `entries`; the files and bytes freed."""
    freed, size = 0, 0
    for e in entries:
        try:
            st = e.stat(follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                continue
            os.unlink(e.path)
        except FileNotFoundError:  # another prune's collect freed it first
            continue
        freed, size = freed + 1, size + st.st_size
    return freed, size


def shared(path: Path) -> int:
    """How many names the file at `path` has in the store (1: its own; 0: cannot be read)."""
    try:
        return os.lstat(path).st_nlink
    except OSError:
        return 0


def shared_note(release: Path, was: bytes, now: bytes) -> str:
    """Why other releases may be damaged too, from a stored release's manifests as recorded (`was`)
    and now. A changed file still linked from elsewhere was written in place, and every release
    linking it changed with it."""
    old = set(was.splitlines())
    changed = [line.split(b" ", 4)[4].decode(errors="replace") for line in now.splitlines()
               if line not in old and line.startswith(b"f ") and line.count(b" ") >= 4]
    linked = [(p, n) for p in changed if (n := shared(release / p)) > 1]
    if not linked:
        return ""
    path, n = linked[0]
    return (f"; {path} is one file with {n} names in the store, which keeps identical files "
            "once: written in place, it changed in every release that shares it, so add each "
            "damaged release again")


def usage(directory: Path) -> int:
    """The bytes `directory` takes on disk, each inode counted once (as `du` counts): what the store
    costs."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for path in [directory, *directory.rglob("*")]:
        st = path.lstat()
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total
