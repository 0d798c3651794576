"""Where a release comes from on its way into the store: a release directory, a tar archive of one,
or an image. `add_source` takes any of them, as `release add` and `install --from` do.

An archive is a tar file, plain or compressed (gzip, bzip2, xz, told by content as tar does). It
holds a release at its top or in a single top directory. It is read as a stream within the store's
limits (`tarstream`: every member and header counted, only the current member held). Each member is
checked before it is written, and the first refused is named in one line. Refused: an absolute name,
a `..` component, a control character, a name part over _NAME_MAX bytes, anything but a regular file
or directory (symlink, hard link, device, FIFO, sparse file), a file or tree over the store's limits
(`tree`). It is unpacked into a private directory in the store (`release_store.scratch`, 0700) and
stored from there as a directory is (`packing.add`). A refusal leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import NoReturn

from ... import files
from ...errors import BadArchive, ReleaseError
from ...node.releases import store as release_store
from ...node.releases import tree
from ...node.releases.moving import Meter, Report
from ...node.releases.room import Room, room
from ...node.store_config import DEFAULTS, StoreConfig, raise_key, size_text
from ...system.podman import parse_reference
from ...wiring import Node
from . import images, packing, tarstream

MANIFEST = "release.toml"
_NOTHING = "nothing was stored"
_SHOWN = 200  # characters of a member's name a refusal shows
_NAME_MAX = 255  # bytes of one name in a path (ext4, xfs, btrfs, tmpfs)
SOURCES = ("a release directory (from `agent-fsm release pack`), a tar archive of one (.tar, "
           ".tar.gz, .tgz), or an image (oci-archive:FILE, docker-archive:FILE, "
           "containers-storage:REF, docker://REF)")


def add_source(source: str, node: Node, report: Report | None = None) -> packing.Added:
    """Store the release `source` names and return what was stored; `image` is set when it came from
    an image. ReleaseError (and `packing.add`'s refusals) in one line; a failure stores nothing.
    `report` is told the copies' progress (`moving`)."""
    ref = parse_reference(source)
    if ref is not None:
        done = images.add(ref, node, report=report)
        return dataclasses.replace(done.release, image=done.image)
    path = Path(source)
    if path.is_dir():
        return packing.add(path, node, report=report)
    if path.is_file():
        return add_archive(path, node, report)
    if os.path.lexists(path):
        raise ReleaseError(f"{source} is neither a directory nor a regular file; give {SOURCES}; "
                           + _NOTHING)
    raise ReleaseError(f"{source} does not exist; give {SOURCES}; " + _NOTHING)


def add_archive(archive: Path, node: Node, report: Report | None = None) -> packing.Added:
    """Store the release the tar archive `archive` holds (see the module docstring)."""
    with release_store.scratch(node.paths.releases_dir) as holder:
        into = holder / "release"
        unpack(archive, into, node.config.store, room(node.paths.releases_dir), report)
        return packing.add(release_root(archive, into), node, shown_as=str(archive),
                           report=report)


def _refuse(archive: Path, why: str) -> NoReturn:
    raise ReleaseError(f"refusing release archive {archive}: {why}; {_NOTHING}")


def unpack(archive: Path, into: Path, limits: StoreConfig = DEFAULTS,
           space: Room | None = None, report: Report | None = None) -> None:
    """Unpack the tar archive `archive` into the new directory `into`, checking each member before
    it is written; ReleaseError names the first refused.

    `limits`: the host's ceilings. `space`: the room on the disk of `into`; each file is checked to
    fit before it is written (NoRoom). `report`: told the archive's bytes read (as stored) and the
    files written. Files are 0755 when the member has an x bit, else 0644 (the store sets modes
    again); owners, times and other bits are dropped.
    """
    try:
        raw = open(archive, "rb")  # noqa: SIM115 (closed by the `with` below)
    except OSError as exc:
        raise ReleaseError(f"cannot read release archive {archive}: {exc.strerror or exc}; "
                           + _NOTHING) from None
    # Every member counts, the archive's own top (`./`) and a top directory too.
    bounds = {"max_members": limits.max_release_files + 2, "max_bytes": limits.max_release_bytes}
    need = 0
    meter = None if report is None else Meter(report, "unpacking", str(archive), None,
                                              os.fstat(raw.fileno()).st_size)
    try:
        with raw, tarstream.Reader(raw, **bounds) as tar:
            files.make_dir(into, 0o700)
            for member in tar.members():
                rel = _checked(archive, member)
                if not rel.parts:  # the archive's own top, "." or "./"
                    continue
                target = into.joinpath(*rel.parts)
                try:
                    if member.kind == tarstream.DIRECTORY:
                        _make_dirs(into, target)
                        continue
                    if member.size > limits.max_file_bytes:
                        _refuse(archive, f"member {_shown(member.name)} is larger than "
                                         f"{size_text(limits.max_file_bytes)} "
                                         f"({raise_key('max_file_bytes')})")
                    if space is not None:  # the size is known as the stream is read
                        need += -(-member.size // space.block) * space.block
                        if not space.fits(need):
                            raise space.refuse(f"release archive {archive}", need, so_far=True)
                    _make_dirs(into, target.parent)
                    _write(tar.data(), member, target)
                    if meter is not None:
                        meter.at(raw.tell(), meter.files + 1)
                except (FileExistsError, NotADirectoryError):
                    _refuse(archive, f"member {_shown(member.name)} is in the archive twice, or "
                                     "below a file of the same name")
            if meter is not None:
                meter.done()
    except BadArchive as exc:
        _refuse(archive, str(exc))
    except OSError as exc:
        raise ReleaseError(f"cannot unpack release archive {archive} into the store: {exc}; "
                           + _NOTHING) from None


def _make_dirs(into: Path, directory: Path) -> None:
    """Make `directory` and its missing parents below `into`, each exactly 0700; FileExistsError
    when a file holds one of their names."""
    missing = []
    while directory != into and not os.path.lexists(directory):
        missing.append(directory)
        directory = directory.parent
    if not stat.S_ISDIR(os.lstat(directory).st_mode):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(directory))
    for path in reversed(missing):
        files.make_dir(path, 0o700)


def _shown(name: str) -> str:
    """A member's name as a refusal shows it: quoted, control characters escaped, a long one cut."""
    return repr(name) if len(name) <= _SHOWN else f"{name[:_SHOWN]!r}… ({len(name)} characters)"


_KINDS = {b"2": "a symlink", b"1": "a hard link", b"3": "a device", b"4": "a device",
          b"6": "a FIFO", tarstream.SPARSE: "a sparse file"}


def _checked(archive: Path, member: tarstream.Member) -> PurePosixPath:
    """The member's path relative to the archive's top. Refused in one line naming it when absolute,
    with a `..` component, or neither a regular file nor a directory."""
    name, shown = member.name, _shown(member.name)
    path = PurePosixPath(name)
    if path.is_absolute():
        _refuse(archive, f"member {shown} is an absolute path (a release's members are "
                         "relative to its top)")
    if ".." in path.parts:
        _refuse(archive, f"member {shown} has a `..` component (it could land outside the "
                         "release)")
    if not all(part.isprintable() for part in path.parts):  # as the store refuses it
        _refuse(archive, f"member {shown} has a name with a control character or not UTF-8")
    if member.kind in (tarstream.FILE, tarstream.DIRECTORY):
        if len(path.parts) > tree.MAX_DEPTH + 2:  # a top directory, then the release
            _refuse(archive, f"member {shown} is nested more than {tree.MAX_DEPTH} directories "
                             "deep (the store's limit)")
        if any(len(os.fsencode(part)) > _NAME_MAX for part in path.parts):
            _refuse(archive, f"member {shown} has a name longer than {_NAME_MAX} bytes (more "
                             "than a file system takes)")
        return path
    what = _KINDS.get(member.kind, f"of tar type {member.kind!r}")
    if member.kind in (b"1", b"2"):
        what += f" (to {_shown(member.linkname)})"
    _refuse(archive, f"member {shown} is {what}; a release holds regular files and directories "
                     "only")


def _write(data: Iterator[bytes], member: tarstream.Member, target: Path) -> None:
    mode = tree.EXEC_MODE if member.mode & 0o111 else tree.FILE_MODE
    out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                  0o600)
    try:
        for chunk in data:
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view):]
        os.fchmod(out, mode)
    finally:
        os.close(out)


def release_root(archive: Path, into: Path) -> Path:
    """The directory of the unpacked archive that holds release.toml: its top, or its single top
    directory; refused in one line otherwise."""
    if (into / MANIFEST).is_file():
        return into
    tops = sorted(e.name for e in os.scandir(into) if e.is_dir(follow_symlinks=False))
    if len(tops) == 1 and (into / tops[0] / MANIFEST).is_file():
        return into / tops[0]
    held = ("nothing" if not any(into.iterdir()) else
            f"{len(tops)} directories: {', '.join(tops)}" if len(tops) > 1 else
            f"the directory {tops[0]!r}, without one" if tops else "files only")
    _refuse(archive, f"it holds no {MANIFEST} at its top or in a single top directory (its top "
                     f"holds {held}): not a release from `agent-fsm release pack`")
