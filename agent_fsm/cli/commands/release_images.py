"""The image side of `agent-fsm release`: add from an image, pack into one, and say what prune did
with the images releases came from (docs/containers.md)."""

from __future__ import annotations

from pathlib import Path

import typer

from ...actions.releases import images as image_releases
from ...actions.releases import origins
from ...errors import ReleaseError
from ...node.releases.moving import Report
from ...system.podman import REGISTRY, STORE, ImageRef, Podman, parse_reference
from ...untrusted import MAX_LINE, shown
from .. import options
from ..render import out


def _say(line: str) -> None:
    """One line of ids, references and podman's words (none of them agent-fsm's)."""
    out.print(shown(line, MAX_LINE), soft_wrap=True)  # whole lines: ids and paths are grepped


def show_image(image: origins.Image) -> None:
    """Say where the image a release was just added from is, and whether prune removes it."""
    whose = ("added to podman's store by agent-fsm: prune removes it with its release"
             if image.added else "in podman's store already: prune leaves it there")
    _say(f"image {image.id} (manifest {image.digest or 'unknown'}; {whose})")


def pack_image(ctx: typer.Context, version: str, output: Path | None,
               workload: tuple[str, ...], image: str, sign_key: Path | None,
               payload: Path | None = None, report: Report | None = None) -> None:
    """`release pack --image REF`: a name (or containers-storage:NAME) is tagged in podman's
    store; an archive reference is written as that file."""
    try:
        ref = parse_reference(image)
    except ReleaseError as exc:
        raise typer.BadParameter(str(exc), param_hint="--image") from None
    target: ImageRef | str
    if ref is None:
        if not image or image.startswith("-") or any(c.isspace() for c in image):
            raise typer.BadParameter(f"{image!r} is not an image name", param_hint="--image")
        target = image
    elif ref.transport == REGISTRY:
        raise typer.BadParameter(
            f"{image}: build into podman's store (--image NAME), then push it yourself "
            f"(`podman push NAME {image}`)", param_hint="--image")
    else:
        target = ref.target if ref.transport == STORE else ref
    podman = Podman(options.of(ctx).node().config.podman)
    kept, image_id = image_releases.pack(version, target, workload, podman, output, sign_key,
                                           payload, report)
    where = f"{target}" if isinstance(target, ImageRef) else f"containers-storage:{target}"
    also = f" (and its directory {kept})" if kept is not None else ""
    _say(f"packed release {version} as image {image_id} in {where}{also}")


def show_images(done: origins.ImagesPruned, dry_run: bool) -> None:
    """One line per recorded image: removed (or would be), or kept and why."""
    verb = "would remove" if dry_run else "removed"
    for version, image in done.removed:
        _say(f"{verb} image {image.id} of {version} ({image.reference})")
    for version, image, why in done.kept:
        _say(f"kept image {image.id} of {version} ({', '.join(why)})")
    for version, image, error in done.failed:
        _say(f"could not remove image {image.id} of {version}: {error}")


def images_failed(done: origins.ImagesPruned) -> None:
    """Exit 1 (one line) when podman would not remove an image prune meant to remove."""
    if done.failed:
        ids = ", ".join(f"{i.id} of {v}" for v, i, _ in done.failed)
        raise ReleaseError(f"podman did not remove image {ids}: {done.failed[0][2]}; it stays "
                           "recorded and the next `agent-fsm release prune` tries again")

