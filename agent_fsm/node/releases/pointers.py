"""Releases on the host and the two pointers into them: `selected` and `last-good`.

A release is a directory `<state_dir>/releases/<version>/`. It holds `release.toml` (its version
and, optionally, the workload the daemon supervises), `bin/agent-fsm` and `assets/` (the templates
of its service assets). The pointers are symlinks switched atomically, so systemd's `ExecStart` can
run through `selected`.

Every read of a stored release goes through `manifest`, which first checks it against its recorded
digest (`release_store`). So a changed release is refused before it is selected, rendered or run.
"""

from __future__ import annotations

import contextlib
import os
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from ... import files
from ...errors import BadTree, ReleaseError
from ..paths import Paths
from ..sha256 import prefer_openssl
from . import hashes as release_hashes
from . import repair as release_repair
from . import signing
from . import store as release_store
from . import tree as release_tree
from . import workload as workload_command

MAX_MANIFEST_BYTES = 64 << 10

# `\Z`, not `$`: `$` also matches before a trailing newline, and "1.0\n" is no version. So a
# reader's `VERSION_RE.match` (validate.py) holds the whole string to the rule.
VERSION_RE = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}\Z")


class Manifest(NamedTuple):
    version: str
    workload: tuple[str, ...] = ()


def check_version(version: str) -> str:
    if not VERSION_RE.fullmatch(version) or ".." in version:
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
        data = tomllib.loads(files.read_regular(path, MAX_MANIFEST_BYTES).decode("utf-8"))
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and TOMLDecodeError included
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
    workload_command.check(workload, f"release manifest {path}")
    return Manifest(version, tuple(workload))


class Integrity(NamedTuple):
    """A stored release against its recorded digest, for `release list`."""

    digest: str | None  # recorded when it was added; None when no record can be read
    recorded: bool
    problem: str | None  # why it would be refused; None when intact
    signed: str | None = None  # the digest its release.sig signs; None when unsigned


class Releases:
    def __init__(self, paths: Paths) -> None:
        self.paths = paths
        # Every check walks the whole tree, but hashes a file again only when its stat differs from
        # its record of hashes (or, within `checked_once`, from this block's last hash of it). The
        # table lives as long as the block: a daemon idling with it would hold ~450 bytes a file.
        self._hashed: release_tree.Hashed = {}
        self._recorded: set[str] = set()  # versions whose record of hashes was read in the block
        self._once: dict[str, tuple[Manifest, release_store.Checked]] | None = None

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

    @contextlib.contextmanager
    def checked_once(self) -> Iterator[None]:
        """Within the block each release is checked at most once. The daemon's start renders the
        selected release's assets and starts its workload milliseconds apart, and a check walks
        ~1,000 entries even when nothing needs hashing. Nested, it is the outer block."""
        if self._once is not None:
            yield
            return
        self._once = {}
        try:
            yield
        finally:
            self._once, self._hashed, self._recorded = None, {}, set()

    def _checked(self, version: str, *,
                 every_byte: bool = False) -> tuple[Manifest, release_store.Checked]:
        if not every_byte and self._once is not None and version in self._once:
            return self._once[version]
        path = self.path(version) / "release.toml"
        try:
            checked = self._check(check_version(version), None) if every_byte else \
                self.verify(version)
            found = read_manifest(path, expected_version=version), checked
            if self._once is not None:
                self._once[version] = found
            return found
        except FileNotFoundError:
            known = ", ".join(self.versions()) or "none"
            raise ReleaseError(
                f"release {version} is not on this host ({path} is missing); known releases: "
                f"{known}; add it with `agent-fsm release add DIR`"
            ) from None

    def manifest(self, version: str) -> Manifest:
        """The stored release's manifest, once the release is checked against its digest."""
        return self._checked(version)[0]

    def verify(self, version: str) -> release_store.Checked:
        """Check a stored release against its recorded digest (one without a record is damaged).
        ReleaseError says what differs and what to do; FileNotFoundError when it is not stored."""
        if self._once is None:  # nothing kept past this check
            return self._check(version, release_hashes.recorded_hashed(
                self.paths.releases_dir, check_version(version)))
        if check_version(version) not in self._recorded:
            self._recorded.add(version)
            self._hashed.update(release_hashes.recorded_hashed(self.paths.releases_dir, version))
        return self._check(version, self._hashed)

    def reread(self, version: str) -> Manifest:
        """`verify`, reading and hashing every byte whatever its recorded stat. Install, activate
        and upgrade run it on the release they will run, so damage that kept a file's stat is caught
        first. A daemon start and the way back run `verify`: a walk that reads no file whose stat is
        recorded. ReleaseError as `manifest` says it; within `checked_once`, the rest of the block
        uses it. Hashes with OpenSSL's SHA-256: only short-lived commands read a whole release, and
        there OpenSSL's hashes the ~15 MB of a packed release in 25 ms of CPU, CPython's in 60."""
        prefer_openssl()
        return self._checked(version, every_byte=True)[0]

    def _check(self, version: str, hashed: release_tree.Hashed | None) -> release_store.Checked:
        try:
            return release_store.check(self.paths.releases_dir, version, hashed)
        except BadTree as exc:
            raise ReleaseError(
                f"release {version} is not what was stored: {exc}; it was not used. Add it again "
                f"with `agent-fsm release add DIR` (DIR: release {version}'s directory), which "
                f"replaces a damaged copy, or remove it with `agent-fsm release prune {version}`"
            ) from None

    def mend(self, version: str) -> list[tuple[str, Path]]:
        """`verify`, putting back each file that is not what was stored from an intact copy in the
        store (`repair.repair`; the caller holds the writers' lock). Returns (file, its source) per
        file put back. ReleaseError, as `verify` says it, when damaged beyond that."""
        try:
            self._checked(version)
            return []
        except ReleaseError as damaged:
            try:
                fixed = release_repair.repair(self.paths.releases_dir, version)
            except (BadTree, OSError) as exc:
                raise ReleaseError(f"{damaged}; not repaired: {exc}") from None
        self._checked(version)
        return fixed

    def integrity(self, version: str, seen: release_tree.Hashed | None = None) -> Integrity:
        """Hash the whole release against its digest (what `release list` and `doctor` show).
        `seen`: files hashed by earlier calls of this run. A later release sharing the same
        unchanged inode does not read them again. It keeps only shared files, so a release's own
        100,000s add nothing."""
        try:
            checked = release_store.check(self.paths.releases_dir, check_version(version), seen,
                                          shared=True)
        except (BadTree, OSError) as exc:
            try:
                was = release_store.recorded(self.paths.releases_dir, version)
            except BadTree:
                was = None
            return Integrity(None if was is None else release_store.digest(was), was is not None,
                             str(exc), None if was is None else signing.signed_digest(was))
        return Integrity(release_store.digest(checked.recorded), True, None,
                         signing.signed_digest(checked.recorded))

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

    def running(self) -> str | None:
        """The stored release whose `lib/` holds the agent_fsm package imported here. That is the
        release this process runs, not `selected`: a release's `bin/agent-fsm` resolves the pointer
        it was started through. None when run from elsewhere (a checkout, a wheel)."""
        package = Path(__file__).resolve().parents[2]
        release = package.parent.parent
        if package.parent.name != "lib" or not VERSION_RE.fullmatch(release.name):
            return None
        try:
            if not release.parent.samefile(self.paths.releases_dir):
                return None
        except OSError:
            return None
        return release.name

    def last_good(self) -> str | None:
        return self._pointer(self.paths.last_good)

    def _point(self, link: Path, version: str) -> None:
        self._checked(version)  # refuse to point at a missing or broken release
        # Relative target: the pointer stays right when the tree is seen below --root.
        target = os.path.relpath(self.path(version), link.parent)
        files.atomic_symlink(link, target)

    def select(self, version: str) -> None:
        self._point(self.paths.selected, version)

    def promote(self, version: str) -> None:
        self._point(self.paths.last_good, version)
