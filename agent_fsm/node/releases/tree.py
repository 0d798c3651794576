"""A release tree as the store holds it: the normalized copy `release add` makes, and the walk that
hashes a stored one (`release_store` records and checks the digest).

A stored copy holds regular files and directories only. A symlink, device, FIFO or socket is refused
by name, and no link is followed. The copy is owned by the uid that stored it. Directories and
executables (any x bit) are 0755, other files 0644: never setuid, setgid, sticky or writable by
group or others. A tree on its way in (`copy`, `scan` of a packed one) is held to the host's
ceilings (`[store]`, `StoreConfig`), each refusal naming its key. A stored tree is checked against
its record instead, so a ceiling lowered later never strands the way back. MAX_DEPTH bounds every
walk.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, NoReturn

from ... import files
from ...errors import BadTree
from ..sha256 import sha256
from ..store_config import DEFAULTS, StoreConfig, raise_key, size_text

if TYPE_CHECKING:
    from .moving import Meter
    from .objects import Objects

MAX_DEPTH = 32  # nested directories
DIR_MODE = EXEC_MODE = 0o755
FILE_MODE = 0o644
_CHUNK = 1 << 16  # larger reads grow a long-lived daemon ~6 MB per check
_WHOLE = 1 << 20  # a file up to this is read whole by a copy, and written from memory
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Entry(NamedTuple):
    path: str  # relative, `/` between names
    mode: int
    size: int | None = None  # None: a directory
    sha256: str = "-"

    def line(self) -> bytes:
        kind, size = ("d", "-") if self.size is None else ("f", str(self.size))
        return f"{kind} {self.mode:04o} {size} {self.sha256} {self.path}\n".encode()


def normal_mode(st: os.stat_result) -> int:
    """The mode the store gives an entry: 0755 for directories and executables, else 0644."""
    return DIR_MODE if stat.S_ISDIR(st.st_mode) or st.st_mode & 0o111 else FILE_MODE


def _bad_kind(st: os.stat_result, dir_fd: int, name: str, path: Path) -> NoReturn:
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        raise BadTree(path, f"is a symlink (to {os.readlink(name, dir_fd=dir_fd)})")
    what = "device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else \
        "FIFO" if stat.S_ISFIFO(mode) else "socket" if stat.S_ISSOCK(mode) else "special file"
    raise BadTree(path, f"is a {what}")


def _check_stored(st: os.stat_result, path: Path) -> None:
    if st.st_uid != os.geteuid():
        raise BadTree(path, f"is owned by uid {st.st_uid}, not {os.geteuid()}")
    if st.st_mode & 0o7022:
        raise BadTree(path, f"has mode {stat.S_IMODE(st.st_mode):04o}")


def walk(root_fd: int, root: Path, *, stored: bool,
          limits: StoreConfig | None) -> Iterator[tuple[str, int, str, os.stat_result]]:
    """Every entry below `root_fd` as (relative path, parent's fd, name, lstat), each directory
    before its contents, names sorted. Only regular files and directories, within `limits` (None:
    only MAX_DEPTH). `stored`: also refuse another uid's entry or a mode the store never gives. A
    Path is built only to name a refused entry: each daemon start walks ~1,000 entries."""
    count = 0
    uid = os.geteuid()
    most = None if limits is None else limits.max_release_files

    def names(dir_fd: int) -> Iterator[str]:
        nonlocal count
        found = []
        with os.scandir(dir_fd) as it:
            for e in it:
                count += 1
                if most is not None and count > most:
                    raise BadTree(root, f"has more than {most:,} files and directories "
                                  f"({raise_key('max_release_files')})")
                found.append(e.name)
        return iter(sorted(found))

    # One frame for the whole walk, not one per level: each entry passes through it alone.
    stack = [(root_fd, "", 1, names(root_fd))]
    try:
        while stack:
            dir_fd, prefix, depth, left = stack[-1]
            for name in left:
                rel = prefix + name
                if not name.isprintable():
                    raise BadTree(root / repr(rel),
                                  "has a name with a control character or not UTF-8")
                st = os.lstat(name, dir_fd=dir_fd)
                is_dir = stat.S_ISDIR(st.st_mode)
                if not (is_dir or stat.S_ISREG(st.st_mode)):
                    _bad_kind(st, dir_fd, name, root / rel)
                if stored and (st.st_uid != uid or st.st_mode & 0o7022):
                    _check_stored(st, root / rel)
                yield rel, dir_fd, name, st
                if is_dir:
                    if depth >= MAX_DEPTH:
                        raise BadTree(root / rel,
                                      f"is nested more than {MAX_DEPTH} directories deep")
                    fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
                    try:
                        stack.append((fd, rel + "/", depth + 1, names(fd)))
                    except BaseException:
                        os.close(fd)
                        raise
                    break  # its entries next, then the rest of this directory's
            else:
                stack.pop()
                if stack:  # the root's fd is the caller's
                    os.close(dir_fd)
    finally:
        for dir_fd, *_ in stack[1:]:
            os.close(dir_fd)


class Reader:
    """Reads the files of one tree within the per-file and per-release byte ceilings (None: none)."""

    def __init__(self, root: Path, limits: StoreConfig | None) -> None:
        self.root = root
        self.total = 0
        self.file_bytes = self.release_bytes = 1 << 63
        if limits is not None:
            self.file_bytes, self.release_bytes = limits.max_file_bytes, limits.max_release_bytes

    def too_big(self, rel: str) -> NoReturn:
        raise BadTree(self.root / rel, f"is larger than {size_text(self.file_bytes)} "
                      f"({raise_key('max_file_bytes')})")

    def chunks(self, dir_fd: int, name: str, st: os.stat_result, rel: str, *,
               again: bool = False, size: int = _CHUNK) -> Iterator[bytes]:
        """The bytes of the file `rel` (`name` in `dir_fd`, lstat `st` when walked), `size` at a
        time. `again`: a second read, not counted twice against the release's limit."""
        fd = self.open(dir_fd, name, st, rel, again=again)
        try:
            read, size = size, 0
            while chunk := os.read(fd, read):
                size += len(chunk)
                self.total += 0 if again else len(chunk)
                if size > self.file_bytes:
                    self.too_big(rel)
                if self.total > self.release_bytes:
                    self.too_many_bytes()
                yield chunk
        finally:
            os.close(fd)

    def open(self, dir_fd: int, name: str, st: os.stat_result, rel: str, *,
             again: bool = False) -> int:
        """An fd of the file `rel` as walked (`st`); refused when it was replaced or is already over
        a limit."""
        return self._opened(dir_fd, name, st, rel, again)[0]

    def _opened(self, dir_fd: int, name: str, st: os.stat_result, rel: str,
                again: bool = False) -> tuple[int, int]:
        """`open`, and the file's size as opened."""
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)  # a link swapped in: ELOOP
        try:
            now = os.fstat(fd)
            if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                raise BadTree(self.root / rel, "was replaced while it was read")
            if now.st_size > self.file_bytes:  # refused before a byte is copied
                self.too_big(rel)
            if not again and self.total + now.st_size > self.release_bytes:
                self.too_many_bytes()
        except BaseException:
            os.close(fd)
            raise
        return fd, now.st_size

    def whole(self, dir_fd: int, name: str, st: os.stat_result, rel: str) -> bytes:
        """The bytes of the file `rel` of at most _WHOLE bytes, counted as `chunks` counts them. One
        read when it gives the size the file had as opened, else reads to its end."""
        fd, size = self._opened(dir_fd, name, st, rel)
        try:
            data = os.read(fd, size + 1)  # one more: a file that grew does not end here
            if len(data) != size:
                parts, held = [data], len(data)
                while held <= _WHOLE and (chunk := os.read(fd, _WHOLE + 1 - held)):
                    parts.append(chunk)
                    held += len(chunk)
                data = b"".join(parts)
        finally:
            os.close(fd)
        self.total += len(data)
        if len(data) > self.file_bytes:
            self.too_big(rel)
        if self.total > self.release_bytes:
            self.too_many_bytes()
        if len(data) > _WHOLE:  # it grew since it was walked: never held whole
            raise BadTree(self.root / rel, "changed while it was read")
        return data

    def too_many_bytes(self) -> NoReturn:
        raise BadTree(self.root, f"holds more than {size_text(self.release_bytes)} "
                      f"({raise_key('max_release_bytes')})")


WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _write(target: str, data: bytes, mode: int) -> None:
    """Write a new file `target` with these bytes and mode."""
    out = os.open(target, WRITE_FLAGS, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(out, view):]
        os.fchmod(out, mode)
    finally:
        os.close(out)


def _copy_file(reader: Reader, dir_fd: int, name: str, st: os.stat_result, rel: str,
               target: str, mode: int, objects: Objects | None) -> tuple[str, int,
                                                                        os.stat_result]:
    """Store the file `rel` as the new name `target`, reading each byte once. Returns its hash, size
    and stat as stored. A small file (up to _WHOLE bytes) is read whole, hashed, and linked to an
    intact object of those bytes or written. A larger one is copied by the kernel and hashed as
    written (`bigcopy`). It is then replaced by a link to an intact object of the same bytes, or
    kept as that object."""
    if st.st_size <= _WHOLE:
        data = reader.whole(dir_fd, name, st, rel)
        sha = sha256()
        sha.update(data)
        digest, size = sha.hexdigest(), len(data)
        now = None if objects is None else objects.link(target, digest, mode, size)
        if now is not None:
            return digest, size, now
        _write(target, data, mode)
    else:
        from .bigcopy import stored

        digest, size = stored(reader, dir_fd, name, st, rel, target, mode, WRITE_FLAGS)
        now = None if objects is None else objects.adopt(target, digest, mode, size)
        if now is not None:
            return digest, size, now
    if objects is not None:
        objects.keep(target, digest, mode)
    return digest, size, os.lstat(target)


def open_root(root: Path, *, follow: bool) -> int:
    try:
        return os.open(root, _DIR_FLAGS & ~os.O_NOFOLLOW if follow else _DIR_FLAGS)
    except NotADirectoryError:
        raise BadTree(root, "is not a directory") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise BadTree(root, "is a symlink") from None
        raise


def copy(src: Path, dst: Path, objects: Objects | None = None,
         hashed: Hashed | None = None, limits: StoreConfig = DEFAULTS,
         meter: Meter | None = None) -> None:
    """Store a normalized copy of the release directory `src` as the new directory `dst`.

    `src` may be a symlink (the operator named it); nothing inside it is followed. `dst` is left
    0700: the caller renames it into place, then opens it up. Each file is read once (`_copy_file`)
    and becomes a link to an intact object or a new object (`objects.Objects`). Its hash goes into
    `hashed`, keyed as `scan` keys it, so the manifest's scan reads no file again. One sync of the
    file system makes the copy durable. `limits`: the host's ceilings. `meter`: counts files and
    bytes as copied (`moving`). Without `objects` (a payload copied into a release being packed),
    each file is a plain copy, a large one hashed on a worker while the next are copied
    (`bigcopy.Hashers`), and nothing is synced. Raises BadTree for an entry the store refuses;
    OSError as it comes (DiskError from `files`).
    """
    from . import bigcopy  # threads: here, not in the walks the daemon makes

    src_fd = open_root(src, follow=True)
    try:
        files.make_dir(dst, 0o700)
        reader = Reader(src, limits)
        base = f"{dst}/"  # strings: a release may hold 100,000s of files
        with bigcopy.Hashers() as hashers:  # joined before the tree is used or removed

            def done(sha: str, size: int, now: os.stat_result, rel: str, mode: int) -> None:
                if hashed is not None:
                    hashed[key(rel, now)] = Entry(rel, mode, size, sha)

            for rel, dir_fd, name, st in walk(src_fd, src, stored=False, limits=limits):
                target = base + rel
                if stat.S_ISDIR(st.st_mode):
                    files.make_dir(Path(target), DIR_MODE)
                    continue
                mode = normal_mode(st)
                if objects is None and st.st_size > _WHOLE:  # hashed on a worker meanwhile
                    size = bigcopy.handed(reader, dir_fd, name, st, rel, target, mode,
                                          WRITE_FLAGS, hashers,
                                          functools.partial(done, rel=rel, mode=mode))
                else:
                    sha, size, now = _copy_file(reader, dir_fd, name, st, rel, target, mode,
                                                objects)
                    done(sha, size, now, rel, mode)
                if meter is not None:
                    meter.moved(size, files=1)
        if objects is None:
            return
        # Durable before the commit renames it into place. An object named before its bytes were
        # written (a power cut here) comes back short; `Objects.link` checks through the link, so no
        # add links it, and it is only replaced.
        files.sync_filesystem(dst)
    finally:
        os.close(src_fd)


_SETTLED_NS = 2_000_000_000
# A file's hash, keyed by its inode, size, mode and times: no writer can set st_ctime_ns, so an
# unchanged key means unchanged bytes. The stat is packed (STAMP: device, inode, size, mode, mtime,
# ctime): a release of 100,000 files holds 100,000 keys.
STAMP = struct.Struct("<QQQQqq")
Key = tuple[str, bytes]
Hashed = dict[Key, Entry]


def key(rel: str, st: os.stat_result) -> Key:
    """How `Hashed` keys the file `rel` with this stat."""
    return rel, STAMP.pack(st.st_dev, st.st_ino, st.st_size, st.st_mode, st.st_mtime_ns,
                           st.st_ctime_ns)


def scan(release: Path, *, stored: bool = True, normalize: bool = False,
         hashed: Hashed | None = None, fresh: bool = False, shared: bool = False,
         limits: StoreConfig | None = None,
         seen: Callable[[os.stat_result], None] | None = None) -> list[Entry]:
    """The entries of a release tree, hashed, in manifest order.

    - `stored`: refuse what the store never holds (another owner, a loose mode).
    - `normalize`: give the modes the store would.
    - `hashed`: known hashes, reused while the stat is the same, and filled with new ones.
    - `fresh`: also fill it with files whose times are fresh, for a tree no other process can have
      written (the store's own staging copy).
    - `shared`: fill it only with files of more than two names, the only ones another release can
      meet again.
    - `limits`: the ceilings of a tree on its way in (None: a stored one, checked against its
      record).
    - `seen`: called with each entry's lstat, as walked.
    """
    root_fd = open_root(release, follow=False)
    reader = Reader(release, limits)
    entries = []
    try:
        if stored:
            _check_stored(os.fstat(root_fd), release)
        for rel, dir_fd, name, st in walk(root_fd, release, stored=stored, limits=limits):
            if seen is not None:
                seen(st)
            mode = normal_mode(st) if normalize else stat.S_IMODE(st.st_mode)
            if stat.S_ISDIR(st.st_mode):
                entries.append(Entry(rel, mode))
                continue
            known = key(rel, st)
            if hashed is not None and known in hashed:
                entries.append(hashed[known])
                continue
            h, size = sha256(), 0
            for chunk in reader.chunks(dir_fd, name, st, rel):
                h.update(chunk)
                size += len(chunk)
            entries.append(Entry(rel, mode, size, h.hexdigest()))
            # Not kept while its times are fresh: a change in the same clock tick would keep the
            # same stat (git's "racily clean" entries).
            if hashed is not None and size == st.st_size and (
                    not shared or st.st_nlink > 2) and (
                    fresh or time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > _SETTLED_NS):
                hashed[known] = entries[-1]
    finally:
        os.close(root_fd)
    entries.sort(key=lambda e: e.path.encode())
    return entries
