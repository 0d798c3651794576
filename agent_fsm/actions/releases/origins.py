"""The images releases came from: what `release add` recorded of each, and which `release prune`
removes (only those agent-fsm brought into podman's store).

A release added from an image has a record, `<state_dir>/releases/.images/<version>` (hidden, so
never taken for a version). It is a document of kind `image-record` (`node.state.document_file`),
written atomically under the writers' lock, with this body:

    {"version": "2.0.0",
     "images": [{"reference": "oci-archive:/srv/agent-fsm-2.0.0.tar", "id": "sha256:…",
                 "digest": "sha256:…", "added": true}]}

`id` is podman's image id (the digest of its configuration, whatever the transport). `digest` is the
manifest's digest as podman reports it ("" if none). `added` is true when that `release add` put the
image into podman's store. Only such an image is removed, once its version is neither stored nor
kept by prune's rule (`pruning.protected` and what prune was asked).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from ... import files
from ...errors import DocumentError, ReleaseError
from ...node.releases.pointers import natural_key
from ...node.state import validate
from ...node.state.document_file import Kind
from ...system.podman import Podman, image_id
from ...wiring import Node

RECORDS = ".images"
SCHEMA = 1
MAX_RECORD_BYTES = 64 << 10
NOT_ADDED = "not added by agent-fsm: it was in podman's store already"


@dataclass(frozen=True)
class Image:
    reference: str  # as given to `release add`
    id: str  # sha256:<hex>, the image's id in podman's store
    digest: str  # sha256:<hex>, its manifest's digest; "" when podman reports none
    added: bool  # `release add` put it into the store: agent-fsm may remove it

    def to_json(self) -> dict[str, Any]:
        return {"reference": self.reference, "id": self.id, "digest": self.digest,
                "added": self.added}


def records(node: Node) -> dict[str, tuple[Image, ...]]:
    """Every version's recorded images. Raises ReleaseError naming a damaged record."""
    directory = node.paths.releases_dir / RECORDS
    try:
        names = sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))
    except FileNotFoundError:
        return {}
    return {v: read(node, v) for v in names}


def _check(data: dict[str, Any], schema: int, version: str | None = None) -> None:
    """A record's fields, of `version`'s record when given."""
    found = data.get("version", validate.MISSING)
    if version is not None and found != version:
        raise validate.invalid("version", found, repr(version))
    for item in validate.array(data.get("images", validate.MISSING), "images"):
        _image(item)


KIND = Kind("image-record", "image record", "the record", SCHEMA, _check, MAX_RECORD_BYTES,
            0o644)


def read(node: Node, version: str) -> tuple[Image, ...]:
    """The images recorded for `version` (none when it has no record)."""
    path = node.paths.releases_dir / RECORDS / version
    try:
        data = KIND.read(path, partial(_check, version=version))
    except DocumentError as exc:
        raise ReleaseError(
            f"image record {path} is damaged ({exc.why}); agent-fsm removes no image it cannot "
            "account for, so nothing was removed; compare it with `podman images`, then remove "
            "the file (its images are then left alone)") from None
    return () if data is None else tuple(_image(i) for i in data["images"])


def _image(item: Any) -> Image:
    if not isinstance(item, dict) or set(item) != {"reference", "id", "digest", "added"} or \
            not isinstance(item["reference"], str) or not isinstance(item["added"], bool) or \
            not all(isinstance(item[k], str) for k in ("id", "digest")) or \
            image_id(item["id"]) != item["id"] or \
            (item["digest"] and image_id(item["digest"]) != item["digest"]):
        raise ValueError(f"bad image entry {item!r:.200}")
    return Image(item["reference"], item["id"], item["digest"], item["added"])


def write(node: Node, version: str, images: tuple[Image, ...]) -> None:
    """Replace `version`'s record (the caller holds the writers' lock); no images: removed."""
    path = node.paths.releases_dir / RECORDS / version
    if not images:
        files.remove(path)
        return
    KIND.write(path, {"version": version, "images": [i.to_json() for i in images]})


def remember(node: Node, version: str, image: Image) -> None:
    """Record that `version` came from `image` (the caller holds the writers' lock). An image
    recorded as added stays so when added again."""
    old = read(node, version)
    was = next((i for i in old if i.id == image.id), None)
    if was is not None:
        image = Image(image.reference, image.id, image.digest, image.added or was.added)
    write(node, version, (*(i for i in old if i.id != image.id), image))


@dataclass(frozen=True)
class ImagesPruned:
    """What prune did (or, dry, would do) with recorded images."""

    removed: tuple[tuple[str, Image], ...] = ()  # (version, image)
    kept: tuple[tuple[str, Image, tuple[str, ...]], ...] = ()  # (version, image, why)
    failed: tuple[tuple[str, Image, str], ...] = ()  # (version, image, what podman said)

    def __bool__(self) -> bool:  # any image recorded at all
        return bool(self.removed or self.kept or self.failed)

    def to_json(self) -> dict[str, Any]:
        return {"removed": [{"version": v, **i.to_json()} for v, i in self.removed],
                "kept": [{"version": v, **i.to_json(), "why": list(w)} for v, i, w in self.kept],
                "failed": [{"version": v, **i.to_json(), "error": e} for v, i, e in self.failed]}


@dataclass(frozen=True)
class Plan:
    remove: tuple[tuple[str, Image], ...]
    kept: tuple[tuple[str, Image, tuple[str, ...]], ...]
    forget: tuple[str, ...]  # versions whose record goes once their images are removed


def plan(node: Node, keep: Mapping[str, list[str]]) -> Plan:
    """Which recorded images go, by prune's rule. A version prune keeps (`keep`: version → why) keeps
    its images. Every other version's go (its release is removed now or was earlier), except those
    agent-fsm did not add."""
    remove, kept, forget = [], [], []
    for version, images in sorted(records(node).items(), key=lambda r: natural_key(r[0])):
        if version in keep:
            kept += [(version, i, tuple(keep[version])) for i in images]
            continue
        forget.append(version)
        for i in images:
            if i.added:
                remove.append((version, i))
            else:
                kept.append((version, i, (NOT_ADDED,)))
    return Plan(tuple(remove), tuple(kept), tuple(forget))


def apply(node: Node, todo: Plan, *, dry_run: bool, podman: Podman | None = None,
          locked: Callable[[], contextlib.AbstractContextManager[object]] | None = None,
          ) -> ImagesPruned:
    """Remove the planned images: podman runs without the writers' lock, records are written under
    it (`locked()` takes it; None: the caller holds it). An image podman refuses to remove stays
    recorded for the next prune; one already gone counts as removed. podman is not run when nothing
    is to go."""
    if dry_run or not todo.remove:
        return ImagesPruned(todo.remove, todo.kept)
    podman = podman or Podman(node.config.podman)
    removed, failed = [], []
    for version, image in todo.remove:
        try:
            if podman.find(image.id) is not None:
                podman.remove(image.id)
            removed.append((version, image))
        except ReleaseError as exc:
            failed.append((version, image, str(exc)))
    planned = {(v, i.id) for v, i in todo.remove} | {(v, i.id) for v, i, _ in todo.kept}
    still = {(v, i.id) for v, i, _ in failed}
    with contextlib.nullcontext() if locked is None else locked():
        for version in todo.forget:  # as recorded now: an add meanwhile may have recorded more
            write(node, version, tuple(i for i in read(node, version)
                                       if (version, i.id) in still
                                       or (version, i.id) not in planned))
    return ImagesPruned(tuple(removed), todo.kept, tuple(failed))
