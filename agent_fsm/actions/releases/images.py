"""Releases as OCI images: `release add` from an image reference, `release pack --image`.

A release image holds the release directory at RELEASE_PATH; nothing else is read from it. `add`
brings the image into podman's store (unless there: `containers-storage:`) and mounts it. It stores
the release tree through `packing.add`, the same copy and digest as a directory, then records the
image (`images`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ... import files
from ...errors import ReleaseError
from ...node.releases.moving import Moved, Report
from ...node.releases.pointers import check_version
from ...system.podman import STORE, ImageRef, Podman
from ...wiring import Node
from . import origins, packing

RELEASE_PATH = PurePosixPath("/agent-fsm/release")  # where a release image holds the release
CONTAINERFILE = f"FROM scratch\nCOPY release {RELEASE_PATH}\n"


@dataclass(frozen=True)
class ImageAdded:
    release: packing.Added
    image: origins.Image


def add(ref: ImageRef, node: Node, podman: Podman | None = None,
        report: Report | None = None) -> ImageAdded:
    """Store the release image `ref` holds at RELEASE_PATH, and record the image. `added` is set
    when this call put it into podman's store; it is removed again if storing fails. `report` is
    told podman's pull progress, then the copy's into the store."""
    podman = podman or Podman(node.config.podman)
    if ref.archive and not os.path.isfile(ref.target):
        raise ReleaseError(f"image archive {ref.target} does not exist or is not a regular file "
                           f"({ref}); nothing was stored")
    before = podman.image_ids()
    found = podman.find(ref.target) if ref.transport == STORE else podman.find(
        podman.pull(str(ref), None if report is None else _pulling(report, str(ref))))
    if found is None:
        raise ReleaseError(f"image {ref.target} is not in podman's store (`"
                           f"{' '.join(podman.prefix)} images` lists what is); nothing was stored")
    image_id, digest = found
    added = image_id not in before
    try:
        mount = podman.mount(image_id)
        try:
            stored = packing.add(_tree(mount, ref), node, shown_as=f"{ref} ({RELEASE_PATH})",
                                 report=report)
        finally:
            _quietly(podman.unmount, image_id)  # stored or not, the mount is podman's to keep
    except BaseException:
        if added:
            _quietly(podman.remove, image_id)
        raise
    image = origins.Image(str(ref), image_id, digest, added)
    with node.store.locked():
        origins.remember(node, stored.version, image)
    return ImageAdded(stored, image)


def _pulling(report: Report, what: str) -> Callable[[str], None]:
    """Each line podman says of a pull, as progress: `pulling REF: Copying blob sha256:…`."""
    said = 0

    def line(text: str) -> None:
        nonlocal said
        said += 1
        report(Moved("pulling", what, said, 0, None, None, note=text))

    return line


def _quietly(call: Callable[[str], None], image_id: str) -> None:
    with contextlib.suppress(ReleaseError):  # a clean-up: what failed before it is the news
        call(image_id)


def _tree(mount: Path, ref: ImageRef) -> Path:
    """The release directory in a mounted image. Each part of RELEASE_PATH must be a real directory,
    so no link in the image can point the copy elsewhere on this host."""
    path = mount
    for part in RELEASE_PATH.parts[1:]:
        path = path / part
        where = "/" + str(path.relative_to(mount))
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise ReleaseError(f"image {ref} holds no release: {where} is missing (a release "
                               f"image holds its release at {RELEASE_PATH}; make one with "
                               "`agent-fsm release pack --image`); nothing was stored") from None
        if not stat.S_ISDIR(st.st_mode):
            raise ReleaseError(f"image {ref}: {where} is not a directory (a symlink is never "
                               "followed); nothing was stored")
    return path


def pack(version: str, target: ImageRef | str, workload: tuple[str, ...], podman: Podman,
         output: Path | None = None, sign_key: Path | None = None,
         payload: Path | None = None, report: Report | None = None) -> tuple[Path | None, str]:
    """Build a release image for `version` (`release pack --image`). The release is packed (into
    `output` if given, else a temporary directory) and copied to RELEASE_PATH of a `FROM scratch`
    image. `target` is an image name (tagged in podman's store) or an archive reference (written
    there, not kept in the store). `payload` and `sign_key` as `packing.pack` takes them. Returns
    the release directory kept (or None) and the image's id."""
    check_version(version)
    if isinstance(target, ImageRef) and target.archive and os.path.lexists(target.target):
        raise ReleaseError(f"{target.target} already exists; write the image to a new file")
    with files.private_dir(prefix="agent-fsm-pack.") as work:
        release = packing.pack(version, output or work / "release", workload, sign_key,
                               payload=payload, report=report)
        if output is not None:
            shutil.copytree(release, work / "release")
        (work / "Containerfile").write_text(CONTAINERFILE)
        before = podman.image_ids()
        name = target if isinstance(target, str) else None
        image_id = podman.build(work, work / "Containerfile", name)
        if isinstance(target, ImageRef):
            try:
                podman.save(image_id, target)
            finally:
                if image_id not in before:  # built here, and only wanted in the archive
                    _quietly(podman.remove, image_id)
        return output, image_id
