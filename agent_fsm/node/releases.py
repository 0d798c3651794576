"""Releases on the host and the two pointers into them: `selected` and `last-good`.

A release is a directory `<state_dir>/releases/<version>/` holding `release.toml` (its version
and, optionally, the workload the daemon supervises), `bin/agent-fsm` and `assets/` (the
templates of the service assets this version writes). The pointers are symlinks switched
atomically, so systemd's `ExecStart` can run through `selected`.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .. import files
from ..errors import ReleaseError
from .paths import Paths

VERSION_RE = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}$")


@dataclass(frozen=True)
class Manifest:
    version: str
    workload: tuple[str, ...] = ()


def check_version(version: str) -> str:
    if not VERSION_RE.match(version) or ".." in version:
        raise ReleaseError(
            f"{version!r} is not a release version: use letters, digits, '.', '+', '_' and '-'"
        )
    return version


def natural_key(version: str) -> tuple[tuple[int, int | str], ...]:
    """Order versions as people do: 10.0.0 after 9.1.0."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", version) if p)


def read_manifest(path: Path, expected_version: str | None = None) -> Manifest:
    """Read and check a `release.toml`; a stored release's must name its directory's version.

    A missing file raises FileNotFoundError, which each caller words for its own context.
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ReleaseError(f"release manifest {path} is invalid: {exc}") from None
    unknown = set(data) - {"version", "workload"}
    if unknown:
        raise ReleaseError(f"release manifest {path}: unknown key(s) {', '.join(sorted(unknown))}")
    version = data.get("version")
    if expected_version is not None and version != expected_version:
        raise ReleaseError(
            f"release manifest {path} says version {version!r}, but its directory "
            f"is {expected_version!r}; re-add the release"
        )
    if not isinstance(version, str):
        raise ReleaseError(f"release manifest {path} has no `version` string")
    check_version(version)
    workload = data.get("workload", [])
    if not isinstance(workload, list) or not all(isinstance(a, str) for a in workload):
        raise ReleaseError(f"release manifest {path}: `workload` must be a list of strings")
    return Manifest(version, tuple(workload))


class Releases:
    def __init__(self, paths: Paths) -> None:
        self.paths = paths

    def path(self, version: str) -> Path:
        return self.paths.releases_dir / check_version(version)

    def versions(self) -> list[str]:
        try:
            return sorted(p.name for p in self.paths.releases_dir.iterdir()
                          if p.is_dir() and not p.name.startswith("."))
        except FileNotFoundError:
            return []

    def exists(self, version: str) -> bool:
        return (self.path(version) / "release.toml").is_file()

    def manifest(self, version: str) -> Manifest:
        path = self.path(version) / "release.toml"
        try:
            return read_manifest(path, expected_version=version)
        except FileNotFoundError:
            known = ", ".join(self.versions()) or "none"
            raise ReleaseError(
                f"release {version} is not on this host ({path} is missing); known releases: "
                f"{known}; add it with `agent-fsm release add DIR`"
            ) from None

    def _pointer(self, link: Path) -> str | None:
        try:
            target = os.readlink(link)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ReleaseError(f"pointer {link} is not a symlink: {exc}") from None
        return Path(target).name

    def selected(self) -> str | None:
        return self._pointer(self.paths.selected)

    def last_good(self) -> str | None:
        return self._pointer(self.paths.last_good)

    def _point(self, link: Path, version: str) -> None:
        self.manifest(version)  # refuse to point at a missing or broken release
        # Relative target: the pointer stays right when the tree is seen below --root.
        target = os.path.relpath(self.path(version), link.parent)
        files.atomic_symlink(link, target)

    def select(self, version: str) -> None:
        self._point(self.paths.selected, version)

    def promote(self, version: str) -> None:
        self._point(self.paths.last_good, version)
