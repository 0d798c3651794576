"""`release prune`: takes out of the store (with their images) the releases no rollback or resume
needs. Never the selected, the last-good, a pending upgrade's or an owed transition's."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ... import files
from ...errors import Refused, ReleaseError, StateFileError
from ...node.records import known_bad
from ...node.releases import objects as release_objects
from ...node.releases import store as release_store
from ...node.releases import usage
from ...node.releases.pointers import check_version, natural_key
from ...node.state.store import StateDoc
from ...wiring import Node
from . import origins


@dataclass(frozen=True)
class Pruned:
    """What `prune` did (or, dry, would do): each stored release removed or kept, and why."""

    removed: tuple[str, ...]
    kept: tuple[tuple[str, tuple[str, ...]], ...]  # (version, reasons), in version order
    dry_run: bool = False
    images: origins.ImagesPruned = field(default_factory=origins.ImagesPruned)  # their images
    freed: release_objects.Collected = field(default_factory=release_objects.Collected)  # unlinked files
    freed_bytes: int = 0  # on disk, given back (dry: that would be): `usage.freed_by`

    def to_json(self) -> dict[str, Any]:
        return {"removed": list(self.removed), "dry_run": self.dry_run,
                "freed_bytes": self.freed_bytes,
                "kept": [{"version": v, "why": list(why)} for v, why in self.kept],
                **({"images": self.images.to_json()} if self.images else {}),
                **({"freed": self.freed._asdict()} if self.freed.files else {})}


def protected(node: Node, doc: StateDoc) -> dict[str, list[str]]:
    """The releases the way back or an owed transition may still need, each with why. They are the
    selected, the last-good, and both ends of a pending upgrade (as the signal and state file name
    them). Also each version an owed transition names (`release`, `from`, `upgrade`): `resume`,
    `recover` and the daemon's next start need those."""
    why: dict[str, list[str]] = {}

    def mark(version: object, reason: str) -> None:
        if version is None:
            return
        if not isinstance(version, str):
            raise StateFileError(
                f"state file {node.paths.state_file} names {version!r} as a release ({reason}); "
                "prune cannot tell what it needs, so nothing was removed; run `agent-fsm doctor`")
        reasons = why.setdefault(version, [])
        if reason not in reasons:
            reasons.append(reason)

    releases = node.releases
    mark(releases.selected(), "selected")
    mark(releases.last_good(), "last-good")
    sig = node.signal()
    if sig is not None:
        mark(sig.from_version, "pending upgrade")
        mark(sig.to_version, "pending upgrade")
    if doc.upgrade is not None:
        mark(doc.upgrade.from_version, "pending upgrade")
        mark(doc.upgrade.to_version, "pending upgrade")
    if doc.pending is not None:
        owed = f"owed by an interrupted {doc.pending.trigger}"
        args = doc.pending.args
        mark(args.get("release"), owed)
        mark(args.get("from"), owed)
        upgrade = args.get("upgrade")
        if upgrade is not None:
            if not isinstance(upgrade, dict):
                mark(upgrade, owed)  # refuses: not a pair of versions
            else:
                mark(upgrade.get("from"), owed)
                mark(upgrade.get("to"), owed)
    return why


def prune(node: Node, names: tuple[str, ...] = (), *, keep: int | None = None,
          dry_run: bool = False) -> Pruned:
    """Remove stored releases that neither the way back nor an owed transition needs.

    The `protected` releases stay. Of the rest:
    - by default, releases newer than the selected (staged for an upgrade) stay; older and
      known-bad ones go;
    - `keep=N`: the N newest stay, the rest go (staged ones too);
    - `names`: exactly those go; if any is protected or not stored, the prune is refused
      (Refused, ReleaseError) and nothing is removed.

    The state file is read and the releases taken out (one rename each) under the store's lock. So
    no transition runs meanwhile. Deleting them and `podman rmi` run without it. A damaged state
    file refuses the prune (StateFileError) before anything is removed.
    """
    if names and keep is not None:
        raise ReleaseError("name the releases to remove or give --keep N, not both")
    if keep is not None and keep < 0:
        raise ReleaseError(f"--keep {keep}: give a number of releases, 0 or more")
    releases = node.releases
    with node.store.locked():  # no transition may select a release while it is being removed
        doc = node.store.read()  # damaged: StateFileError, before anything is touched
        why = protected(node, doc)
        stored = sorted(releases.versions(), key=natural_key)
        if names:
            asked = list(dict.fromkeys(check_version(n) for n in names))
            missing = [n for n in asked if n not in stored]
            if missing:
                raise ReleaseError(
                    f"release {', '.join(missing)} is not stored (stored: "
                    f"{', '.join(stored) or 'none'}); nothing was removed")
            refused = [f"{n} ({', '.join(why[n])})" for n in asked if n in why]
            if refused:
                raise Refused(
                    f"will not remove {'; '.join(refused)}: protected, as the way back or what "
                    "an owed transition needs; nothing was removed")
            remove = set(asked)
            for v in set(stored) - remove:
                why.setdefault(v, ["not named"])
        else:
            others = [v for v in stored if v not in why]
            if keep is not None:
                for v in others[max(len(others) - keep, 0):]:
                    why[v] = [f"within --keep {keep}"]
            else:  # a known-bad release is no coming upgrade: `upgrade` refuses it
                selected = releases.selected()
                coming = known_bad.without(node.paths, tuple(others))
                for v in coming:
                    if selected is None:
                        why[v] = ["staged: nothing is selected yet"]
                    elif natural_key(v) > natural_key(selected):
                        why[v] = [f"staged: newer than the selected {selected}"]
            remove = {v for v in stored if v not in why}
        removed = tuple(v for v in stored if v in remove)
        image_plan = origins.plan(node, why)  # a damaged image record refuses before any removal
        gone = [] if dry_run else [_take_out(releases.path(v)) for v in removed]
        if not dry_run:  # and what an interrupted add or prune left
            release_store.sweep(node.paths.releases_dir)
    # The slow part runs without the lock: deleting the trees and `podman rmi` (up to 300 s each).
    # What is deleted is already out of the store; image records are written under the lock again.
    # What it frees is counted first, while the trees are still there.
    where = node.paths.releases_dir
    freed_bytes = usage.freed_by(gone if not dry_run else [where / v for v in removed], where)
    for stale in gone:
        release_store.clear(stale)  # what fails or a crash leaves, the next add or prune does
    # Free stored files no release links: these, and any an interrupted add or prune left (with the
    # trees an interrupted prune took out).
    freed = release_objects.Collected() if dry_run else \
        release_store.tidy(node.paths.releases_dir, node.store.locked)
    pruned_images = origins.apply(node, image_plan, dry_run=dry_run, locked=node.store.locked)
    kept = tuple((v, tuple(why[v])) for v in stored if v not in remove)
    return Pruned(removed, kept, dry_run, pruned_images, freed, freed_bytes)


def _take_out(path: Path) -> Path:
    """Take a release out of the store in one rename; the caller holds the lock and deletes what it
    returns without it. A crash leaves a hidden `.<version>.pruning` (deleted by the next add or
    prune: `release_store.tidy`), never a half release. One left by an earlier prune of this version
    goes first."""
    gone = path.with_name(f".{path.name}.pruning")
    release_objects.moved(path.parent)  # deleting it unlinks names of files others share
    if os.path.lexists(gone):
        files.remove_tree(gone)
    os.replace(path, gone)
    files.fsync_dir(path.parent)
    release_store.forget(path.parent, path.name)
    return gone
