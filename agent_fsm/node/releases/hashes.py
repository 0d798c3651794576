"""The hashes record of a stored release: `releases/.hashed/<version>`, each file's hash with
its stat as the store wrote it (device, inode, size, mode, mtime and ctime, which no writer can
set back), so that a later check re-hashes only a file whose stat differs: a start of the agent
walks its release (~8 ms) instead of reading all of it (~40 ms with OpenSSL, ~100 ms without).
Damage that keeps a file's stat (a disk's bit rot) is then found by `doctor` and `release list`,
which hash everything. A missing or unreadable record only means every file is hashed.

Linking or unlinking a name of a file the store shares (`objects`) moves its ctime, so after
each add and prune that did (`objects.moved` notes it) `refresh_hashed` records such files
again. A record is read and written a
line at a time: a release may hold 100,000s of files.
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
    """Record the files' hashes with their stat as stored (the caller holds the writers' lock),
    in the order they were hashed: a record is read into a table, so no order is needed."""
    _write_hashed(releases_dir, version, (_line(k, e) for k, e in hashed.items()))


def _parsed(data: bytes) -> Iterator[tuple[Key, Entry]]:
    """The entries of a hashes record, one line at a time; ValueError at one it never holds."""
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
    """The hashes recorded when `version` was stored, checked line by line; None when there is
    no record or it is not one (then every file is hashed, as before it existed)."""
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
    """The hashes recorded when `version` was stored, keyed as `scan` keys them; empty when
    there is no record or it is not one (then every file is hashed, as before it existed)."""
    data = _hashed_record(releases_dir, version)
    return {} if data is None else dict(_parsed(data))


_Again = dict[tuple[int, int], tuple[os.stat_result, str] | None]


def _kept(base: str, key: Key, entry: Entry, again: _Again) -> Key | None:
    """The key a recorded file keeps in its record (a new ctime when it was hashed again, in
    `again` once for all its names), or None when it is no longer recorded."""
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
    """Record again the hashes of stored files whose stat changed in its ctime alone, each
    hashed once more: a file linked from several releases changes ctime whenever an add links
    it or a prune unlinks one of its names, and a check of a release re-hashes every file
    whose stat differs from its record. Run after each add and prune: the files are hashed
    without the lock, the records written under it (`locked()`). A record is a cache of true
    facts (this file, with this stat, had this hash), and an entry is written only for a file
    hashed with that stat. Each record is read a line at a time, and only a changed one is
    held, as lines. Skipped, reading nothing, when no stored file's ctime moved since the last
    refresh (`objects.moved`). Returns the files hashed again."""
    try:
        os.unlink(releases_dir / MOVED)  # first: a name moved from now on is noted again
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
