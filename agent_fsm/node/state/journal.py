"""The history journal: one checksummed JSON line per recorded transition, beside the state file.

`<state_dir>/history.jsonl` is appended under the writers' lock and fsynced before the state
file that commits the transition. Each entry carries its `seq`, the state file the last
committed one; readers drop lines past it (a crashed transition's, a torn one). The commit point
is that number, not the journal's length, which rotation and repair change.

A damaged line mid-journal is skipped and reported (`Read.damaged`, shown by `doctor`), never
fatal: the history must not stop an upgrade or a rollback. The writer rewrites a bad tail
atomically, and at `2 * limit` lines keeps the last `limit`, so appends stay O(1).
"""

from __future__ import annotations

import errno
import json
import os
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

from ... import files
from ...errors import StateFileError

FILE_NAME = "history.jsonl"
FILE_MODE = 0o644
_PREFIX = b'{"crc32":"'
_HEAD = len(_PREFIX) + 8 + 2  # the prefix, eight hex digits, '",'

# Raises ValueError naming the field (`errors.Invalid`) if an entry is not one the machine
# writes; given by the store, which knows the machine's names.
Check = Callable[[dict[str, Any], str], None]


class Damaged(NamedTuple):
    line: int  # 1-based, as an editor counts
    why: str


class Read(NamedTuple):
    entries: list[dict[str, Any]]  # committed entries, oldest first, each with its `seq`
    damaged: tuple[Damaged, ...]  # lines skipped in the middle of the journal


def encode(entry: dict[str, Any]) -> bytes:
    """One line: the entry's canonical JSON with the CRC-32 of those bytes inserted first."""
    body = json.dumps(entry, sort_keys=True, separators=(",", ":")).encode()
    return b'%s%08x",%s\n' % (_PREFIX, zlib.crc32(body), body[1:])


def decode(line: bytes) -> dict[str, Any]:
    """The entry on one line (without its newline), or ValueError saying what is wrong."""
    if not line.startswith(_PREFIX) or line[_HEAD - 2:_HEAD] != b'",':
        raise ValueError("has no checksum")
    body = b"{" + line[_HEAD:]
    if f"{zlib.crc32(body):08x}".encode() != line[len(_PREFIX):_HEAD - 2]:
        raise ValueError("has a wrong checksum (damaged or torn)")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise ValueError("is not valid JSON") from None
    if not isinstance(data, dict):
        raise ValueError("is not a JSON object")
    return data


def _seq(entry: dict[str, Any]) -> int:
    return int(entry["seq"])


class Journal:
    def __init__(self, path: Path, check: Check | None = None) -> None:
        self.path = path
        self.check = check

    # Reading ------------------------------------------------------------------------------
    def read(self, upto: int) -> Read:
        """The entries committed up to `upto` (the state file's `seq`). No lock."""
        try:
            raw = files.read_bytes(self.path)
        except OSError as exc:
            raise StateFileError(f"could not read the history journal {self.path}: {exc}; "
                                 "run `agent-fsm doctor`") from None
        return self.parse(raw or b"", upto)

    def parse(self, raw: bytes, upto: int | None) -> Read:
        """The entries of the journal's bytes numbered up to `upto` (None: all)."""
        lines = raw.split(b"\n")
        complete = lines[:-1]  # what follows the last newline is a torn line: not read
        kept: list[dict[str, Any]] = []
        bad: list[Damaged] = []
        last_good = 0
        for number, line in enumerate(complete, 1):
            try:
                entry = decode(line)
                if type(entry.get("seq")) is not int or entry["seq"] < 1:
                    raise ValueError(f"has seq {entry.get('seq')!r}, expected a positive integer")
                if self.check is not None:
                    self.check(entry, "entry")
            except ValueError as exc:
                bad.append(Damaged(number, str(exc)))
                continue
            last_good = number
            kept.append(entry)
        if upto is not None:
            while kept and _seq(kept[-1]) > upto:
                kept.pop()
        # Bad lines after the last good one are a torn tail, not damage: dropped quietly.
        damaged = tuple(d for d in bad if d.line < last_good)
        return Read(kept, damaged)

    # Writing (the caller holds the store's lock) ------------------------------------------
    def append(self, entry: dict[str, Any], limit: int) -> None:
        """Append `entry` and fsync it: durable when this returns.

        A bad tail, or `2 * limit` lines, is rewritten atomically to the last `limit` entries
        and `entry`.
        """
        flags = os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        created = False
        try:
            try:
                fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, FILE_MODE)
                created = True
            except FileExistsError:
                fd = os.open(self.path, flags)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StateFileError(f"history journal {self.path} is a symlink; nothing was "
                                     "written; remove it and run the command again") from None
            raise
        try:
            if not created and not self._appendable(fd, _seq(entry), limit):
                os.close(fd)
                fd = -1
                self._rewrite_with(entry, limit)
                return
            if created:
                os.fchmod(fd, FILE_MODE)  # exact, whatever the umask
            view = memoryview(encode(entry))
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            if fd >= 0:
                os.close(fd)
        if created:
            files.fsync_dir(self.path.parent)  # the new file's entry survives a power loss

    def _appendable(self, fd: int, seq: int, limit: int) -> bool:
        """Whether `seq` may be appended: the file is empty, or ends in a good line below `seq`.

        Only the first and last lines are read, so an append costs the same at any length.
        """
        size = os.fstat(fd).st_size
        if size == 0:
            return True
        last = _last_line(fd, size)
        first = _first_line(fd, size)
        try:
            if last is None or first is None or seq - _seq(decode(first)) + 1 >= 2 * limit:
                return False
            return _seq(decode(last)) < seq
        except (ValueError, KeyError, TypeError):
            return False

    def replace_last(self, entry: dict[str, Any], limit: int) -> None:
        """Replace the last committed entry with `entry`, atomically, so a crash loop does not grow it."""
        self._rewrite_with(entry, limit)

    def _committed(self, upto: int) -> list[dict[str, Any]]:
        """The entries committed up to `upto`, read for a rewrite; the damaged lines it drops are logged."""
        old = self.parse(files.read_bytes(self.path) or b"", upto)
        if old.damaged:
            import logging  # here: only a writer repairing damage logs; `status` need not import it

            logging.getLogger("agent_fsm").warning(
                "history journal %s: dropped %d damaged line(s) (%s) while rewriting it",
                self.path, len(old.damaged), ", ".join(f"line {d.line}: {d.why}" for d in old.damaged))
        return old.entries

    def _rewrite_with(self, entry: dict[str, Any], limit: int) -> None:
        # The last `limit` committed and the new one: should the state write that commits it
        # not happen, `history` still has its `limit` entries.
        self.rewrite([*self._committed(_seq(entry) - 1)[-limit:], entry])

    def rewrite(self, entries: Iterable[dict[str, Any]]) -> None:
        """Replace the journal with `entries` atomically and durably."""
        files.atomic_write(self.path, b"".join(encode(e) for e in entries), FILE_MODE)


def _last_line(fd: int, size: int) -> bytes | None:
    """The file's last line without its newline; None if the file does not end with one."""
    chunk = 4096
    while True:
        start = max(size - chunk, 0)
        data = os.pread(fd, size - start, start)
        if not data.endswith(b"\n"):
            return None
        cut = data.rfind(b"\n", 0, len(data) - 1)
        if cut >= 0 or start == 0:
            return data[cut + 1:-1]
        chunk *= 4


def _first_line(fd: int, size: int) -> bytes | None:
    """The file's first line without its newline; None if it has no newline."""
    chunk = 4096
    while True:
        data = os.pread(fd, min(chunk, size), 0)
        cut = data.find(b"\n")
        if cut >= 0:
            return data[:cut]
        if len(data) >= size:
            return None
        chunk *= 4


def advanced_skipped(skipped: list[dict[str, Any]], entry: dict[str, Any],
              cycle_starts: frozenset[str]) -> list[dict[str, Any]]:
    """The effects let fail in this cycle, after `entry`; a new cycle starts the list again."""
    kept = [] if entry["trigger"] in cycle_starts else skipped
    return kept + [{"time": entry["time"], "trigger": entry["trigger"], **s}
                   for s in entry.get("skipped") or ()]
