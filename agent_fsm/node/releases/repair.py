"""Mending a stored release. Each file whose bytes or mode differ from its recorded manifest is put
back from an intact copy the store holds: its object, or another release's file of the same hash and
mode. The copy is checked through the new name before it replaces the damaged one. The way back
mends its last-good with it (`pointers.Releases.mend`). The byte code `release add` wrote for the
node is removed instead (`bytecode.drop`): the release runs from the sources it was compiled from."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from ... import files
from ...errors import BadTree
from . import bytecode
from .objects import OBJECTS, Objects, intact, moved
from .store import HEADER, differences, manifest, recorded
from .tree import scan


def _files(manifest_bytes: bytes) -> dict[str, tuple[int, int, str]]:
    """A manifest's regular files: path -> (mode, size, sha256)."""
    out = {}
    for line in manifest_bytes[len(HEADER):].decode(errors="replace").splitlines():
        kind, mode, size, sha, path = line.split(" ", 4)
        if kind == "f":
            out[path] = (int(mode, 8), int(size), sha)
    return out


def _intact_copy(releases_dir: Path, version: str, mode: int, size: int,
                 sha: str) -> tuple[Path, os.stat_result] | None:
    """A file of the store with these bytes and mode, checked intact: their object, else another
    stored release's file whose record names them."""
    obj = releases_dir / OBJECTS / f"{sha}-{mode:o}"
    if (st := intact(obj, sha, mode, size)) is not None:
        return obj, st
    wanted = f"f {mode:04o} {size} {sha} "
    for other in sorted(e.name for e in os.scandir(releases_dir)
                        if not e.name.startswith(".") and e.name != version
                        and e.is_dir(follow_symlinks=False)):
        try:
            record_bytes = recorded(releases_dir, other)
        except BadTree:
            continue
        for line in (record_bytes or b"")[len(HEADER):].decode(errors="replace").splitlines():
            rel = line[len(wanted):] if line.startswith(wanted) else None
            if rel and not rel.startswith("/") and ".." not in rel.split("/"):
                path = releases_dir / other / rel
                if (st := intact(path, sha, mode, size)) is not None:
                    return path, st
    return None


def _copy_file(source: Path, target: Path, mode: int) -> None:
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 mode)
    try:
        with open(source, "rb") as src:
            while chunk := src.read(1 << 20):
                os.write(fd, chunk)
        os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)


def repair(releases_dir: Path, version: str) -> list[tuple[str, Path]]:
    """Put back each missing or changed file of stored `version` from an intact copy
    (`_intact_copy`). A new name is renamed over the damaged one, so other releases linking the
    damaged inode keep it until they are mended too. The caller holds the writers' lock. Returns
    (path, source) per file put back. Raises BadTree, repairing nothing, when a difference is not a
    file's (a directory, an extra file) or a file has no intact copy."""
    release = releases_dir / version
    was = recorded(releases_dir, version)
    if was is None:
        raise BadTree(release, "has no recorded manifest to repair it from")
    bytecode.drop(releases_dir, version)
    now = manifest(scan(release))
    wanted, have = _files(was), _files(now)
    others = {line for line in now[len(HEADER):].splitlines() if not line.startswith(b"f ")}
    dirs = {line for line in was[len(HEADER):].splitlines() if not line.startswith(b"f ")}
    if others != dirs or set(have) - set(wanted):
        raise BadTree(release, f"cannot be repaired file by file ({differences(was, now)})")
    damaged = sorted(p for p, entry in wanted.items() if have.get(p) != entry)
    sources = {}
    for rel in damaged:
        mode, size, sha = wanted[rel]
        found = _intact_copy(releases_dir, version, mode, size, sha)
        if found is None:
            raise BadTree(release, f"has no intact copy of {rel} in the store")
        sources[rel] = found[0]
    for rel in damaged:
        mode, size, sha = wanted[rel]
        target = release / rel
        tmp = target.with_name(f".repair-{os.urandom(6).hex()}")
        try:
            moved(releases_dir)  # the source gains a name, the damaged file loses one
            os.link(sources[rel], tmp)
        except OSError as exc:
            if exc.errno not in (errno.EMLINK, errno.EXDEV):
                raise
            _copy_file(sources[rel], tmp, mode)  # linked the most it can be: a copy of its own
        if intact(tmp, sha, mode, size) is None:  # changed since it was checked
            os.unlink(tmp)
            raise BadTree(release, f"cannot be repaired: the copy of {rel} at {sources[rel]} "
                                   "changed while it was used")
        os.replace(tmp, target)
        files.fsync_dir(target.parent)
        Objects(releases_dir).keep(target, sha, mode)  # the object is the intact file again
    return [(rel, sources[rel]) for rel in damaged]
