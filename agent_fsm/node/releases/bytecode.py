"""Byte code that `release add` wrote for the node's own `python` into a stored release's `lib/`.

A pack ships checked-hash byte code of the fast path for the interpreter that packed it. When the
node's `python` is another version, `release add` compiles the same modules for it into the staged
copy's `__pycache__/` before the copy is stored. So no start compiles them again: the launcher runs
Python with -B, and nothing is written into the store later.

Those files are the node's, not the release's: its digest, its signature and a channel's index name
the tree as packed. Their manifest lines are recorded apart, in `releases/.bytecode/<version>` (the
manifest format, these lines alone), and `store.check` holds the tree to both records. So a changed,
added or removed byte-code file is caught as any other byte of the release.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from ... import files
from ...errors import BadTree
from .hashes import MAX_RECORD_BYTES
from .tree import Hashed, scan

RECORDS = ".bytecode"
_HEADER = b"agent-fsm release manifest v1\n"  # `store.HEADER`: one format for both records
_LIB = "lib/"


def record_path(releases_dir: Path, version: str) -> Path:
    return releases_dir / RECORDS / version


def record(releases_dir: Path, version: str, lines: bytes) -> None:
    """Record the node's byte code of a release being stored (none: no record)."""
    path = record_path(releases_dir, version)
    if lines == _HEADER:
        files.remove(path)
        return
    files.ensure_dir(path.parent)
    files.atomic_write(path, lines, 0o644)


def recorded(releases_dir: Path, version: str) -> bytes:
    """The node's byte code recorded for `version`: its manifest lines; b"" when there is none.
    BadTree when the record cannot be read."""
    path = record_path(releases_dir, version)
    try:
        data = files.read_regular(path, MAX_RECORD_BYTES)
    except FileNotFoundError:
        return b""
    except (OSError, ValueError) as exc:
        raise BadTree(path, f"cannot be read: {exc}") from None
    if not data.startswith(_HEADER):
        raise BadTree(path, "is not a byte-code manifest")
    return data[len(_HEADER):]


def compiled(staging: Path, manifest: bytes, hashed: Hashed,
             compile_lib: Callable[[Path], None] | None) -> bytes:
    """Run `compile_lib` on the staged release (it writes byte code below `lib/`), and return the
    manifest of the files it added: those of `lib/` not in the release's `manifest`. Their hashes go
    into `hashed`, keyed as `scan` keys them below `staging`."""
    if compile_lib is None or not (staging / "lib").is_dir():
        return _HEADER
    compile_lib(staging)
    known = {_path(line) for line in manifest.splitlines()}
    below: Hashed = {(rel[len(_LIB):], stamp): e._replace(path=e.path[len(_LIB):])
                     for (rel, stamp), e in hashed.items() if rel.startswith(_LIB)}
    out = [_HEADER]
    for entry in scan(staging / "lib", hashed=below, fresh=True):
        entry = entry._replace(path=_LIB + entry.path)
        if entry.path.encode() not in known:
            out.append(entry.line())
    for (rel, stamp), entry in below.items():
        hashed[_LIB + rel, stamp] = entry._replace(path=_LIB + entry.path)
    return b"".join(out)


def drop(releases_dir: Path, version: str) -> None:
    """Remove the node's byte code from stored `version`, then its record (the caller holds the
    writers' lock). A directory that holds anything else is left, for the check to name."""
    release = releases_dir / version
    lines = recorded(releases_dir, version).splitlines()
    for line in sorted(lines, key=_path, reverse=True):  # files before their directories
        path = release / _path(line).decode()
        if not path.resolve().is_relative_to(release.resolve()):
            continue  # a record naming a path outside the release is damage, not ours to remove
        with contextlib.suppress(OSError):  # missing already, or a directory not empty
            if line.startswith(b"d "):
                path.rmdir()
            else:
                path.unlink()
    files.remove(record_path(releases_dir, version))


def held_to(was: bytes, extra: bytes, now: bytes) -> tuple[bytes, bytes]:
    """The manifest a stored release must have (its own record `was` and the node's byte code
    `extra`), and its manifest `now`, in one order to compare; as given when there is no byte
    code."""
    if not extra:
        return was, now
    return _sorted(was + extra), _sorted(now)


def without(manifest: bytes, extra: bytes) -> bytes:
    """`manifest` less the lines of the node's byte code `extra`."""
    lines = set(extra.splitlines(keepends=True))
    return b"".join(line for line in manifest.splitlines(keepends=True) if line not in lines)


def _path(line: bytes) -> bytes:
    return line.split(b" ", 4)[-1]


def _sorted(manifest: bytes) -> bytes:
    """`manifest`'s lines in one order, by path, whatever order they came in."""
    lines = [line for line in manifest.splitlines(keepends=True) if line != _HEADER]
    lines.sort(key=_path)
    return _HEADER + b"".join(lines)
