"""podman, the one way agent-fsm reaches container images: the references it takes and each call it
makes (through `proc`, with a timeout; a failure is one ReleaseError line)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ReleaseError
from . import proc

# The transports `release add` takes (podman's names), and how each is written.
ARCHIVES = ("oci-archive", "docker-archive")  # FILE: a file on this host
STORE = "containers-storage"  # REF: an image already in podman's store
REGISTRY = "docker"  # docker://REF: pulled from a registry
# Transports podman has and agent-fsm does not take, named so the refusal can say so.
_OTHERS = ("oci", "dir", "docker-daemon", "ostree", "sif", "tarball")
_ID = re.compile(r"(sha256:)?([0-9a-f]{64})")
TIMEOUT = 300.0  # a pull from a registry may be slow; local calls take well under a second


@dataclass(frozen=True)
class ImageRef:
    """An image reference with its transport: where `release add` takes a release from."""

    transport: str  # one of ARCHIVES, STORE, REGISTRY
    target: str  # the archive's absolute path, or the image's name in the store or registry

    def __str__(self) -> str:
        return f"docker://{self.target}" if self.transport == REGISTRY else \
            f"{self.transport}:{self.target}"

    @property
    def archive(self) -> bool:
        return self.transport in ARCHIVES


def parse_reference(text: str) -> ImageRef | None:
    """The image reference `text` is, or None when it names no transport (a release directory). An
    archive's FILE is made absolute. ReleaseError for a transport agent-fsm does not take, or one
    with nothing usable after it."""
    known = [*ARCHIVES, STORE]
    transport, sep, target = text.partition(":")
    if text.startswith("docker://"):
        transport, target = REGISTRY, text[len("docker://"):]
    elif not sep or transport not in known:
        if sep and transport in _OTHERS:
            raise ReleaseError(
                f"{text!r}: agent-fsm does not take podman's {transport}: transport; use "
                "oci-archive:FILE, docker-archive:FILE, containers-storage:REF or docker://REF "
                "(docs/containers.md)")
        return None
    if not target or target != target.strip() or any(c.isspace() or ord(c) < 32 for c in target):
        what = "FILE" if transport in ARCHIVES else "REF"
        form = "docker://REF" if transport == REGISTRY else f"{transport}:{what}"
        raise ReleaseError(f"{text!r} is not an image reference: give {form} "
                           "without spaces or control characters (docs/containers.md)")
    if transport in ARCHIVES:
        return ImageRef(transport, os.path.abspath(target))
    if target.startswith("-"):  # podman would read it as an option
        raise ReleaseError(f"{text!r} is not an image reference: a name cannot start with '-'")
    return ImageRef(transport, target)


def image_id(text: str) -> str:
    """An image id as agent-fsm records it, `sha256:<64 hex>`. Raises ValueError otherwise."""
    found = _ID.fullmatch(text.strip())
    if found is None:
        raise ValueError(f"{text.strip()!r} is not an image id")
    return "sha256:" + found.group(2)


def _arg(image: str) -> str:
    """How podman is given an image: an id without "sha256:". With it, some commands take the id for
    a name (`save` writes `localhost/sha256:…` into the archive)."""
    found = _ID.fullmatch(image)
    return found.group(2) if found else image


class Podman:
    """podman as the config's `podman` argv prefix runs it (its store is the prefix's choice)."""

    def __init__(self, prefix: Sequence[str], timeout: float = TIMEOUT) -> None:
        self.prefix = tuple(prefix)
        self.timeout = timeout

    def _run(self, *args: str, doing: str,
             on_stderr: Callable[[bytes], None] | None = None) -> proc.Completed:
        try:
            return proc.run([*self.prefix, *args], timeout=self.timeout, on_stderr=on_stderr)
        except proc.CouldNotRun as exc:
            raise ReleaseError(
                f"could not {doing}: `{' '.join(self.prefix)}` could not run ({exc.reason}); "
                "install podman or set the `podman` config key (docs/containers.md)") from None

    def _ok(self, *args: str, doing: str,
            on_stderr: Callable[[bytes], None] | None = None) -> str:
        done = self._run(*args, doing=doing, on_stderr=on_stderr)
        if done.returncode != 0:
            said = done.tail.removeprefix("Error: ") or f"exit {done.returncode}"
            raise ReleaseError(f"could not {doing}: podman said: {said}")
        return done.stdout

    def _id(self, text: str, doing: str) -> str:
        try:
            return image_id(proc.last_line(text))
        except ValueError as exc:
            raise ReleaseError(f"could not {doing}: podman answered {exc}") from None

    def image_ids(self) -> frozenset[str]:
        """The id of every image in the store."""
        doing = "list podman's images"
        lines = self._ok("images", "--all", "--quiet", "--no-trunc", doing=doing).split()
        return frozenset(self._id(line, doing) for line in lines)

    def find(self, name: str) -> tuple[str, str] | None:
        """The id and manifest digest ("" if podman has none) of the image `name` names in the
        store; None when there is none."""
        doing = f"look up image {name} in podman's store"
        done = self._run("image", "exists", "--", _arg(name), doing=doing)
        if done.returncode == 1:
            return None
        if done.returncode != 0:
            raise ReleaseError(f"could not {doing}: podman said: {done.tail or done.returncode}")
        out = self._ok("image", "inspect", "--format", "{{.Id}} {{.Digest}}", "--", _arg(name),
                       doing=doing)
        found, _, digest = proc.last_line(out).partition(" ")
        try:
            return self._id(found, doing), image_id(digest) if digest.strip() else ""
        except ValueError as exc:
            raise ReleaseError(f"could not {doing}: podman answered {exc}") from None

    def pull(self, reference: str, on_line: Callable[[str], None] | None = None) -> str:
        """Pull `reference` into podman's store and return the image's id. `on_line` gets each line
        of podman's progress as it comes ("Copying blob …"); without it podman pulls quietly."""
        doing = f"pull {reference} into podman's store"
        if on_line is None:
            return self._id(self._ok("pull", "--quiet", "--", reference, doing=doing), doing)
        return self._id(self._ok("pull", "--", reference, doing=doing,
                                 on_stderr=_lines(on_line)), doing)

    def mount(self, image: str) -> Path:
        """Mount an image's file system read-only (as root); where it is mounted."""
        out = self._ok("image", "mount", "--", _arg(image), doing=f"mount image {image}")
        return Path(proc.last_line(out))

    def unmount(self, image: str) -> None:
        self._ok("image", "unmount", "--", _arg(image), doing=f"unmount image {image}")

    def remove(self, image: str) -> None:
        """Remove an image, never by force: podman refuses one a container uses or another name holds."""
        self._ok("rmi", "--", _arg(image), doing=f"remove image {image}")

    def build(self, context: Path, containerfile: Path, tag: str | None) -> str:
        """Build an image from `containerfile` in `context` (no cache: always a new image)."""
        doing = f"build an image from {context}"
        named = ["--tag", tag] if tag else []
        return self._id(self._ok("build", "--quiet", "--no-cache", "--file", str(containerfile),
                                 *named, "--", str(context), doing=doing), doing)

    def save(self, image: str, ref: ImageRef) -> None:
        """Write an image to the archive `ref` names (oci-archive or docker-archive)."""
        self._ok("save", "--format", ref.transport, "--output", ref.target, "--", _arg(image),
                 doing=f"save image {image} as {ref}")


def _lines(on_line: Callable[[str], None]) -> Callable[[bytes], None]:
    """A chunk reader that gives `on_line` each whole line (decoded, its last 200 bytes)."""
    held = bytearray()

    def read(chunk: bytes) -> None:
        held.extend(chunk)
        *whole, rest = held.split(b"\n")
        held[:] = rest[-4096:]
        for line in whole:
            if line.strip():
                on_line(line[-200:].decode("utf-8", "replace").strip())

    return read
