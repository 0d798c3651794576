"""The release store: each stored release's digest, recorded when it is added and checked before it
is selected or rendered, and the one way a release gets into `releases/`.

A release's digest is "sha256:" and the SHA-256 of its manifest, a UTF-8 text: the header line
`agent-fsm release manifest v1`, then one line per entry below the release directory, sorted by the
relative path's UTF-8 bytes:

    d 0755 - - assets
    f 0644 412 <the SHA-256 of the file's bytes, hex> assets/agent.service

Type (`d` directory, `f` regular file), mode (4 octal digits), size and content hash (`-` for a
directory), and the path, `/` between names. The store holds nothing else (`release_tree`), so this
is all of a release. The manifest is recorded at add in `releases/.digests/<version>` (hidden, so
never taken for a version), so a mismatch can name what changed.

Beside it, `releases/.hashed/<version>` records each file's hash with its stat (`hashes`). Each file
is a hard link to an object, `releases/.objects/<sha256>-<mode>`, kept once (`objects`). Byte code
compiled at add for the node's `python` is recorded apart (`bytecode`).
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from ... import files
from ...errors import AgentFsmError, BadTree, DiskError, Refused
from ..sha256 import hexdigest, prefer_openssl
from ..store_config import StoreConfig
from . import bytecode, room, usage
from .hashes import HASHED, MAX_RECORD_BYTES, record_hashed, refresh_hashed
from .moving import Meter, Report
from .objects import Collected, Objects, collect, moved, shared_note
from .tree import DIR_MODE, Entry, Hashed, copy, scan

HEADER = b"agent-fsm release manifest v1\n"
DIGESTS = ".digests"


def manifest(entries: list[Entry]) -> bytes:
    out = io.BytesIO()  # grown in place: no list of 100,000s of lines beside it
    out.write(HEADER)
    for e in entries:
        out.write(e.line())
    return out.getvalue()


def digest(manifest_bytes: bytes) -> str:
    return "sha256:" + hexdigest(manifest_bytes)


def record_path(releases_dir: Path, version: str) -> Path:
    return releases_dir / DIGESTS / version


def record(releases_dir: Path, version: str, manifest_bytes: bytes) -> None:
    """Record a stored release's manifest (the caller holds the writers' lock)."""
    files.atomic_write(record_path(releases_dir, version), manifest_bytes, 0o644)


def recorded(releases_dir: Path, version: str) -> bytes | None:
    """The manifest recorded for `version`, or None when there is none. Raises BadTree when the
    record is not a readable manifest."""
    path = record_path(releases_dir, version)
    try:
        data = files.read_regular(path, MAX_RECORD_BYTES)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise BadTree(path, f"cannot be read: {exc}") from None
    if not data.startswith(HEADER):
        raise BadTree(path, "is not a release manifest")
    return data


def forget(releases_dir: Path, version: str) -> None:
    files.remove(record_path(releases_dir, version))
    files.remove(releases_dir / HASHED / version)
    files.remove(bytecode.record_path(releases_dir, version))


def differences(was: bytes, now: bytes, limit: int = 3) -> str:
    """What differs between two manifests, in a few words: changed, added and removed paths."""
    def parse(m: bytes) -> dict[str, tuple[str, ...]]:
        rows = (line.split(" ", 4) for line in m[len(HEADER):].decode(errors="replace").splitlines())
        return {r[4]: tuple(r[:4]) for r in rows if len(r) == 5}

    a, b = parse(was), parse(now)
    said = []
    for path in sorted(a.keys() | b.keys()):
        if path not in b:
            said.append(f"{path} removed")
        elif path not in a:
            said.append(f"{path} added")
        elif a[path][0] != b[path][0]:
            said.append(f"{path} changed type")
        elif a[path][2:] != b[path][2:]:
            said.append(f"{path} changed content")
        elif a[path][1] != b[path][1]:
            said.append(f"{path} changed mode {a[path][1]} to {b[path][1]}")
    more = f" and {len(said) - limit} more" if len(said) > limit else ""
    return ", ".join(said[:limit]) + more if said else "its recorded manifest is malformed"


class Checked(NamedTuple):
    """A stored release as it is now, and the manifest recorded when it was added."""

    manifest: bytes
    recorded: bytes

    @property
    def digest(self) -> str:
        return digest(self.manifest)


def check(releases_dir: Path, version: str, hashed: Hashed | None = None,
          shared: bool = False) -> Checked:
    """Check stored release `version` against its recorded manifest (`hashed`, `shared`: see
    `scan`). Raises BadTree saying what differs; FileNotFoundError when it is not stored."""
    release = releases_dir / version
    now = manifest(scan(release, hashed=hashed, shared=shared))
    was = recorded(releases_dir, version)
    if was is None:  # every release is stored with its record: one without is damaged
        raise BadTree(record_path(releases_dir, version), "is missing: no digest was recorded "
                      "for this release")
    want, have = bytecode.held_to(was, bytecode.recorded(releases_dir, version), now)
    if want != have:
        raise BadTree(release, f"does not match its digest {digest(was)} recorded when it was added "
                  f"({differences(want, have)}){shared_note(release, want, have)}")
    return Checked(was, was)


class Stored(NamedTuple):
    version: str
    path: Path
    digest: str
    already: bool  # the same content was stored already, intact
    replaced: str | None = None  # why a stored copy of the same content was replaced
    disk: int | None = None  # its bytes on disk, when known (`Staged`)


class Staged(NamedTuple):
    """A normalized, checked copy of a release, `.adding.*/release` in the store, not yet
    stored: `commit` moves it into place."""

    directory: Path  # where it came from (for messages)
    staging: Path
    version: str
    manifest: bytes
    hashed: Hashed
    bytecode: bytes  # the manifest of the node's byte code added to it (`bytecode`)
    disk: int | None = None  # its bytes on disk, each file once (`usage`); None: not known


@contextlib.contextmanager
def staged(directory: Path, releases_dir: Path, validate: Callable[[Path], str],
           limits: StoreConfig, report: Report | None = None, shown: str | None = None,
           compile_lib: Callable[[Path], None] | None = None) -> Iterator[Staged]:
    """Copy the release `directory` into a hidden directory of `releases_dir`, normalized, within
    `limits`, and `validate` it there (it returns the version). So what is checked is what is
    stored. The copy is removed when the block ends (`commit` it before).

    Needs no lock: the slow part of an add (copy, digest, signature, ABI probe) runs while
    transitions go on. The staging directory is flock(2)ed for the block, so another add's `sweep`
    leaves it. `report` is told the copy's progress (`moving`), naming it `shown` (else
    `directory`). `compile_lib` then writes the node's byte code (`bytecode.compiled`). Raises
    BadTree for an entry the store refuses.
    """
    prefer_openssl()  # an add hashes the whole tree, once: OpenSSL's is the fast one
    with _staging(releases_dir) as holder:
        staging = holder / "release"
        hashed: Hashed = {}
        whole = room.check(directory, releases_dir, limits, f"release {directory}")
        meter = None if report is None else Meter(report, "adding", shown or str(directory),
                                                  whole.files, whole.bytes)
        copy(directory, staging, Objects(releases_dir), hashed, limits, meter)
        if meter is not None:
            meter.done()
        version = validate(staging)
        disk = usage.Disk(os.lstat(staging))
        new = manifest(scan(staging, hashed=hashed, fresh=True, seen=disk.add))
        if len(new) > MAX_RECORD_BYTES:  # it could not be read back
            raise BadTree(directory, f"has a manifest over {MAX_RECORD_BYTES >> 30} GiB")
        extra = bytecode.compiled(staging, new, hashed, compile_lib)
        known = disk.bytes if extra == HEADER else None  # no byte code added after the scan
        yield Staged(directory, staging, version, new, hashed, extra, known)


def commit(releases_dir: Path, staged: Staged) -> Stored:
    """Store a staged release with its digest, renamed into place whole. The caller holds the
    writers' lock for this alone (a few renames, two small records).

    A version stored with the same digest is `already`; a damaged copy, or one without a readable
    record, is replaced. With another digest: Refused, naming both.
    """
    sweep(releases_dir)
    version, new, staging = staged.version, staged.manifest, staged.staging
    target = releases_dir / version
    replaced = None
    if os.path.lexists(target):
        replaced = _replaces(releases_dir, version, new, staged.directory)
        if replaced is None:
            return Stored(version, target, digest(new), already=True)
    os.chmod(staging, DIR_MODE)
    record(releases_dir, version, new)
    record_hashed(releases_dir, version, staged.hashed)  # renaming keeps each file's stat
    bytecode.record(releases_dir, version, staged.bytecode)
    if replaced is not None:  # a crash between the renames: the next add puts it back
        old = releases_dir / f".{version}.replaced.{os.urandom(6).hex()}"
        os.rename(target, old)
        os.rename(staging, target)
        files.fsync_dir(releases_dir)
        moved(releases_dir)  # the replaced copy's names of shared files go
        files.remove_tree(old)
    else:
        os.rename(staging, target)
        files.fsync_dir(releases_dir)
    return Stored(version, target, digest(new), replaced is not None, replaced, staged.disk)


def store(directory: Path, releases_dir: Path, validate: Callable[[Path], str],
          locked: Callable[[], contextlib.AbstractContextManager[object]],
          limits: StoreConfig, report: Report | None = None, shown: str | None = None,
          compile_lib: Callable[[Path], None] | None = None) -> Stored:
    """Store a normalized copy of the release `directory` in `releases_dir` with its digest: staged
    and checked without the writers' lock, committed under it (`locked()`). `report`, `shown`,
    `compile_lib`: see `staged`."""
    done = None
    try:
        done = _staged_and_committed(directory, releases_dir, validate, locked, limits, report,
                                     shown, compile_lib)
        return done
    except (OSError, DiskError) as exc:  # the disk filled: NoRoom, one line; else as it came
        full = room.filled(exc, f"release {directory}", releases_dir.parent)
        if full is None:
            raise
        raise full from None
    finally:  # objects of a refused copy, a replaced one, or what an interrupted add left
        tidy(releases_dir, locked, done)


def _staged_and_committed(directory: Path, releases_dir: Path, validate: Callable[[Path], str],
                          locked: Callable[[], contextlib.AbstractContextManager[object]],
                          limits: StoreConfig, report: Report | None, shown: str | None,
                          compile_lib: Callable[[Path], None] | None) -> Stored:
    """`store` without its tidying, in a frame of its own so the staged copy's hashes are freed
    before `tidy` reads every release's."""
    with staged(directory, releases_dir, validate, limits, report, shown,
                compile_lib) as ready, locked():
        return commit(releases_dir, ready)


def tidy(releases_dir: Path, locked: Callable[[], contextlib.AbstractContextManager[object]],
         added: Stored | None = None) -> Collected:
    """After an add or a prune: delete trees an interrupted prune took out (`.<version>.pruning`),
    free unlinked objects (`objects.collect`), record again files whose ctime moved
    (`refresh_hashed`), and record the store's bytes (`usage.record`; `added`: see there).

    Housekeeping: what cannot be done now (a full disk, the lock held) the next add or prune does,
    so it never fails a done add or prune. Needs no lock: what it deletes is out of the store.
    """
    freed = Collected()
    with contextlib.suppress(AgentFsmError, OSError):
        for stale in releases_dir.glob(".*.pruning"):
            clear(stale)
        freed = collect(releases_dir)
        refresh_hashed(releases_dir, locked)
        usage.record(releases_dir, locked, added and (added.version, added.disk))
    return freed


@contextlib.contextmanager
def _in_use(staging: Path) -> Iterator[None]:
    """Mark a staging directory as in use (a shared flock on it) for the block. BadTree if a sweep
    removed it before it was marked."""
    import fcntl

    fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        if os.fstat(fd).st_nlink == 0:
            raise BadTree(staging, "was removed by another add's sweep; run the add again")
        yield
    finally:
        os.close(fd)


def _abandoned(staging: Path) -> bool:
    """Whether no add is working in this staging directory (nothing holds its flock)."""
    import fcntl

    try:
        fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return True  # not a directory we can open: not an add's
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def _replaces(releases_dir: Path, version: str, new: bytes, directory: Path) -> str | None:
    """None when the stored `version` is `new`, intact. Why it is replaced when it holds the same
    content, damaged or without a readable record. Refused when its content differs."""
    try:
        was = recorded(releases_dir, version)
    except BadTree:
        was = None
    if was is None:  # a missing or unreadable record: compare the tree as the store would hold it
        try:
            tree = manifest(scan(releases_dir / version, stored=False, normalize=True))
            stored = digest(bytecode.without(tree, bytecode.recorded(releases_dir, version)))
        except (BadTree, OSError) as exc:
            stored = f"none (its copy cannot be read: {exc})"
        if stored == digest(new):
            return "its digest record was missing or unreadable"
    elif was == new:
        try:
            check(releases_dir, version)
            return None
        except BadTree as exc:
            return f"the stored copy was damaged: {exc}"
    else:
        stored = digest(was)
    raise Refused(
        f"release {version} is already stored with digest {stored}, but {directory} has digest "
        f"{digest(new)}: a version's content never changes; pack this one as a new version, or "
        f"remove {version} first (`agent-fsm release prune {version}`) if nothing needs it; "
        "nothing was stored")


def sweep(releases_dir: Path) -> None:
    """Clear what an interrupted add or prune left, putting back a release an add was replacing.
    That is staging copies no add works in, and records (and their temporary files) of releases not
    stored. The caller holds the writers' lock, under which every record is written."""
    for stale in releases_dir.glob(".*.replaced.*"):
        back = releases_dir / stale.name[1:].split(".replaced.")[0]
        if os.path.lexists(back):
            files.remove_tree(stale)
        else:
            os.rename(stale, back)
    for stale in [*releases_dir.glob(".adding.*"), *releases_dir.glob(".*.adding")]:
        if _abandoned(stale):  # another add may be staging there, without the lock
            clear(stale)
    for path in releases_dir.glob(f".{usage.USAGE}.*.tmp"):  # a write of it cut short
        files.remove(path)
    for kind in (DIGESTS, HASHED, bytecode.RECORDS):
        for path in (releases_dir / kind).glob("*"):
            hidden = path.name.startswith(".")
            if path.name.endswith(".tmp") if hidden else not (releases_dir / path.name).is_dir():
                files.remove(path)


@contextlib.contextmanager
def scratch(releases_dir: Path) -> Iterator[Path]:
    """A private directory (0700) in `releases_dir` for a release before it is staged (an archive
    unpacked), removed when the block ends. It is named and flock(2)ed as a staging directory. So
    the next commit's `sweep` clears an interrupted add's leftovers, never one in use, and messages
    name it as the staging copy."""
    with _staging(releases_dir) as holder:
        yield holder


@contextlib.contextmanager
def _staging(releases_dir: Path) -> Iterator[Path]:
    """A new `.adding.<random>` directory in `releases_dir` (`files.private_dir`: 0700, exclusive, a
    failed removal an error), flock(2)ed for the block (`_in_use`). The state directory is made or
    checked 0700 first, so it never exists wider."""
    files.ensure_private_dir(releases_dir.parent)  # the state dir
    files.ensure_dir(releases_dir)
    with files.private_dir(releases_dir, ".adding.") as holder, _in_use(holder):
        yield holder


def clear(stale: Path) -> None:
    """Remove what an interrupted add or prune left (`files.remove_tree`). What cannot be removed
    now is left to the next add or prune, with a warning naming it and why. Clearing leftovers never
    fails the command."""
    try:
        files.remove_tree(stale)
    except AgentFsmError as exc:
        import logging  # here: only a failed clean-up logs

        logging.getLogger("agent_fsm").warning("%s; the next add or prune tries again", exc)
