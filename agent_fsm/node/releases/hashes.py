"""The hashes record of a stored release: `releases/.hashed/<version>`. It holds each file's hash
with its stat as stored (device, inode, size, mode, mtime, ctime; no writer can set ctime back). A
check re-hashes only files whose stat differs. So an agent start walks its release in ~8 ms instead
of reading it in ~40 ms (OpenSSL) or ~100 ms (without). Damage that keeps the stat (bit rot) is
found by `doctor` and `release list`, which hash everything. Without a readable record, every file
is hashed.

Linking or unlinking a name of a shared file (`objects`) moves its ctime. So after each add or prune
that did (`objects.moved`), `refresh_hashed` records such files again. Records are read and written
a line at a time: a release may hold 100,000s of files.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import stat
import struct
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from ... import files
from .objects import MOVED, intact, moved
from .tree import STAMP, Entry, Hashed, Key
from .tree import key as tree_key

HASHED = ".hashed"
HASHED_HEADER = b"agent-fsm release hashes v1\n"
MAX_RECORD_BYTES = 1 << 30  # a record (and a recorded manifest): a million lines of ~1 KiB


def _line(key: Key, entry: Entry) -> bytes:
    rel, (dev, ino, size, mode, mtime, ctime) = key[0], STAMP.unpack(key[1])
    return f"{dev} {ino} {size} {mode} {mtime} {ctime} {entry.sha256} {rel}\n".encode()


def _write_hashed(releases_dir: Path, version: str, lines: Iterable[bytes]) -> None:
    files.atomic_write(releases_dir / HASHED / version, itertools.chain([HASHED_HEADER], lines),
                       0o644)


def record_hashed(releases_dir: Path, version: str, hashed: Hashed) -> None:
    """Record the files' hashes with their stat as stored; the caller holds the writers' lock. Order
    is free: a record is read into a table."""
    _write_hashed(releases_dir, version, (_line(k, e) for k, e in hashed.items()))


def _parsed(data: bytes) -> Iterator[tuple[Key, Entry]]:
    """The entries of a hashes record, one line at a time; ValueError at a line it never holds."""
    pos = len(HASHED_HEADER)
    while pos < len(data):
        end = data.find(b"\n", pos)
        end = len(data) if end < 0 else end
        *numbers, sha, rel = data[pos:end].decode().split(" ", 7)
        pos = end + 1
        dev, ino, size, mode, mtime, ctime = map(int, numbers)
        if len(sha) != 64 or sha.strip("0123456789abcdef") or not stat.S_ISREG(mode):
            raise ValueError("not a hashes record")
        try:
            stamp = STAMP.pack(dev, ino, size, mode, mtime, ctime)
        except struct.error:
            raise ValueError("not a hashes record") from None
        yield (rel, stamp), Entry(rel, stat.S_IMODE(mode), size, sha)


def _hashed_record(releases_dir: Path, version: str) -> bytes | None:
    """The hashes recorded when `version` was stored, checked line by line; None when there is no
    valid record (every file is then hashed)."""
    try:
        data = files.read_regular(releases_dir / HASHED / version, MAX_RECORD_BYTES)
        if not data.startswith(HASHED_HEADER):
            return None
        for _ in _parsed(data):
            pass
    except (OSError, ValueError):  # missing, unreadable, or not a record
        return None
    return data


def recorded_hashed(releases_dir: Path, version: str) -> Hashed:
    """The hashes recorded when `version` was stored, keyed as `scan` keys them; empty when there is
    no valid record (every file is then hashed). Read once: a start of a release of 20,000 files
    parses 20,000 lines."""
    try:
        data = files.read_regular(releases_dir / HASHED / version, MAX_RECORD_BYTES)
        return dict(_parsed(data)) if data.startswith(HASHED_HEADER) else {}
    except (OSError, ValueError):  # missing, unreadable, or not a record
        return {}


_Again = dict[tuple[int, int], tuple[os.stat_result, str] | None]


def _kept(base: str, key: Key, entry: Entry, again: _Again) -> Key | None:
    """The key a recorded file keeps in its record, or None when it is no longer recorded. A file
    hashed again gets a new ctime, in `again` once for all its names."""
    rel, (dev, ino, size, mode, mtime, ctime) = key[0], STAMP.unpack(key[1])
    if rel.startswith("/") or ".." in rel.split("/"):
        return None  # not a record this store wrote
    try:
        st = os.lstat(base + rel)
    except OSError:
        return None  # gone: the check says so
    if (st.st_dev, st.st_ino, st.st_size, st.st_mode, st.st_mtime_ns) != \
            (dev, ino, size, mode, mtime):
        return None  # changed: the check hashes it, and says so if it differs
    if st.st_ctime_ns != ctime and (dev, ino) not in again:
        now = intact(base + rel, entry.sha256, stat.S_IMODE(mode), size)
        again[(dev, ino)] = None if now is None else (now, entry.sha256)
    found = again.get((dev, ino)) if st.st_ctime_ns != ctime else (st, entry.sha256)
    if found is None or found[1] != entry.sha256 or found[0].st_ino != ino:
        return None
    return tree_key(rel, found[0])


def refresh_hashed(releases_dir: Path,
                   locked: Callable[[], contextlib.AbstractContextManager[object]]) -> int:
    """Record again the hashes of stored files whose stat changed only in its ctime, hashing each
    once more. Returns the files hashed again.

    An add or prune moves the ctime of every shared file it links or unlinks. A check re-hashes each
    file whose stat differs from its record. This runs after each add and prune: files are hashed
    without the lock, records written under it (`locked()`). An entry is written only for a file
    hashed with that stat, so a record holds only true facts. Records are read a line at a time, and
    only a changed one is held, as lines. Nothing is read when no ctime moved since the last refresh
    (`objects.moved`).
    """
    try:
        os.unlink(releases_dir / MOVED)  # first: a name moved from here on is noted again
    except FileNotFoundError:
        return 0
    try:
        return _refresh(releases_dir, locked)
    except BaseException:
        moved(releases_dir)  # still to do: the next tidy does it
        raise


def _refresh(releases_dir: Path,
             locked: Callable[[], contextlib.AbstractContextManager[object]]) -> int:
    versions = [e.name for e in os.scandir(releases_dir)
                if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)]
    again: _Again = {}
    changed: dict[str, list[bytes]] = {}
    for version in versions:
        data = _hashed_record(releases_dir, version)
        if data is None:
            continue
        base = f"{releases_dir}/{version}/"  # strings: ~10,000 files for ten releases
        if all(_kept(base, key, entry, again) == key for key, entry in _parsed(data)):
            continue  # read again only when something changed: a record of a big release
        lines = [_line(kept, entry) for key, entry in _parsed(data)  # is held as lines alone
                 if (kept := _kept(base, key, entry, again)) is not None]
        if lines:
            changed[version] = lines
    if changed:
        with locked():
            for version, new in changed.items():
                if os.path.isdir(releases_dir / version):  # not pruned meanwhile
                    _write_hashed(releases_dir, version, new)
    return len(again)
