"""Where a release comes from on its way into the store: a release directory, a tar archive of
one, or an image. `add_source` takes any of them, as `release add` and `install --from` do.

An archive is a tar file, plain or compressed (gzip, bzip2, xz: told by its content, as tar
does), holding a release at its top or in a single top directory: the rules the fleet
collection's `agent_fsm.fleet.release` module applies to the archives it is given. Each member
is checked as it is read, before it is written, and the first one refused is named in one line:
an absolute name, a `..` component, a control character in its name, anything but a regular
file or a directory (a symlink, a hard link, a device, a FIFO), a file or a tree over the
store's limits (`tree`). It is unpacked
into a private directory inside the store (`release_store.scratch`, 0700) and stored from there
as a directory is (`packing.add`: the same normalizing copy, checks and digest); whatever is
refused, nothing is left behind.
"""

from __future__ import annotations

import dataclasses
import os
import tarfile
import zlib
from pathlib import Path, PurePosixPath
from typing import NoReturn

from ...errors import ReleaseError
from ...node.releases import store as release_store
from ...node.releases import tree
from ...system.podman import parse_reference
from ...wiring import Node
from . import images, packing

MANIFEST = "release.toml"
_CHUNK = 1 << 16
_NOTHING = "nothing was stored"
# What a damaged or truncated archive raises, by its compression (bz2 raises OSError).
_UNREADABLE: tuple[type[Exception], ...] = (tarfile.TarError, EOFError, zlib.error)
try:  # a Python built without lzma reads no .tar.xz (tarfile says so)
    import lzma
    _UNREADABLE += (lzma.LZMAError,)
except ImportError:  # pragma: no cover
    pass
SOURCES = ("a release directory (from `agent-fsm release pack`), a tar archive of one (.tar, "
           ".tar.gz, .tgz), or an image (oci-archive:FILE, docker-archive:FILE, "
           "containers-storage:REF, docker://REF)")


def add_source(source: str, node: Node) -> packing.Added:
    """Store the release `source` names (see the module docstring) and return what was stored;
    `image` is set when it came from an image. ReleaseError (and the refusals of
    `packing.add`) in one line; nothing is stored when it fails."""
    ref = parse_reference(source)
    if ref is not None:
        done = images.add(ref, node)
        return dataclasses.replace(done.release, image=done.image)
    path = Path(source)
    if path.is_dir():
        return packing.add(path, node)
    if path.is_file():
        return add_archive(path, node)
    if os.path.lexists(path):
        raise ReleaseError(f"{source} is neither a directory nor a regular file; give {SOURCES}; "
                           + _NOTHING)
    raise ReleaseError(f"{source} does not exist; give {SOURCES}; " + _NOTHING)


def add_archive(archive: Path, node: Node) -> packing.Added:
    """Store the release the tar archive `archive` holds (see the module docstring)."""
    with release_store.scratch(node.paths.releases_dir) as holder:
        into = holder / "release"
        unpack(archive, into)
        return packing.add(release_root(archive, into), node, shown_as=str(archive))


def _refuse(archive: Path, why: str) -> NoReturn:
    raise ReleaseError(f"refusing release archive {archive}: {why}; {_NOTHING}")


def unpack(archive: Path, into: Path) -> None:
    """Unpack the tar archive `archive` into the new directory `into`, member by member, each
    checked before it is written (see the module docstring); ReleaseError naming the first one
    refused. Files are written 0755 when the member has an x bit, else 0644 (the store gives
    the modes again); owners, times and other bits in the archive are not kept."""
    try:  # the compression told by the content
        opened = tarfile.open(archive, "r")  # noqa: SIM115 (closed by the `with` below)
    except _UNREADABLE:  # its words list each method tried, on several lines
        _refuse(archive, "it is not a tar archive (plain, or compressed with gzip, bzip2 or xz)")
    except OSError as exc:
        raise ReleaseError(f"cannot read release archive {archive}: {exc.strerror or exc}; "
                           + _NOTHING) from None
    entries = total = 0
    try:
        with opened as tar:
            os.mkdir(into, 0o700)
            for member in tar:
                rel = _checked(archive, member)
                if not rel.parts:  # the archive's own top, "." or "./"
                    continue
                entries += 1
                if entries > tree.MAX_ENTRIES:
                    _refuse(archive, f"it holds more than {tree.MAX_ENTRIES} files and "
                                     "directories (the store's limit)")
                target = into.joinpath(*rel.parts)
                try:
                    if member.isdir():
                        os.makedirs(target, 0o700, exist_ok=True)
                        continue
                    if member.size > tree.MAX_FILE_BYTES:
                        _refuse(archive, f"member {member.name!r} is larger than "
                                         f"{tree.MAX_FILE_BYTES >> 20} MiB (the store's limit)")
                    total += member.size
                    if total > tree.MAX_RELEASE_BYTES:
                        _refuse(archive, f"it holds more than {tree.MAX_RELEASE_BYTES >> 20} MiB "
                                         "of files (the store's limit)")
                    os.makedirs(target.parent, 0o700, exist_ok=True)
                    _write(tar, member, target)
                except (FileExistsError, NotADirectoryError):
                    _refuse(archive, f"member {member.name!r} is in the archive twice, or "
                                     "below a file of the same name")
    except _UNREADABLE as exc:
        _refuse(archive, f"it cannot be read to its end as a tar archive (damaged or "
                         f"truncated?): {' '.join(str(exc).split())}")
    except OSError as exc:
        raise ReleaseError(f"cannot unpack release archive {archive} into the store: {exc}; "
                           + _NOTHING) from None


def _checked(archive: Path, member: tarfile.TarInfo) -> PurePosixPath:
    """The member's path relative to the archive's top; refused (one line naming it) when it
    is absolute, has a `..` component, or is not a regular file or a directory."""
    name = member.name
    path = PurePosixPath(name)
    if path.is_absolute():
        _refuse(archive, f"member {name!r} is an absolute path (a release's members are "
                         "relative to its top)")
    if ".." in path.parts:
        _refuse(archive, f"member {name!r} has a `..` component (it could land outside the "
                         "release)")
    if not all(part.isprintable() for part in path.parts):  # as the store refuses it
        _refuse(archive, f"member {name!r} has a name with a control character or not UTF-8")
    if member.isfile() or member.isdir():
        if len(path.parts) > tree.MAX_DEPTH + 2:  # a top directory, then the release
            _refuse(archive, f"member {name!r} is nested more than {tree.MAX_DEPTH} directories "
                             "deep (the store's limit)")
        return path
    what = (f"a symlink (to {member.linkname!r})" if member.issym() else
            f"a hard link (to {member.linkname!r})" if member.islnk() else
            "a device" if member.ischr() or member.isblk() else
            "a FIFO" if member.isfifo() else f"of tar type {member.type!r}")
    _refuse(archive, f"member {name!r} is {what}; a release holds regular files and directories "
                     "only")


def _write(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> None:
    source = tar.extractfile(member)
    if source is None:  # not a file (checked before): nothing to read
        raise tarfile.ExtractError(f"member {member.name!r} has no data")
    mode = tree.EXEC_MODE if member.mode & 0o111 else tree.FILE_MODE
    out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                  0o600)
    try:
        with source:
            while chunk := source.read(_CHUNK):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view):]
        os.fchmod(out, mode)
    finally:
        os.close(out)


def release_root(archive: Path, into: Path) -> Path:
    """The directory of the unpacked archive that holds release.toml: its top, or its single
    top directory; refused (one line) otherwise."""
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
