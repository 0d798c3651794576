"""`doctor`'s look at the release store: every stored release against its digest, and what the store
takes on disk with the room left."""

from __future__ import annotations

from ...errors import ReleaseError
from ...node.releases import usage
from ...node.releases.tree import Hashed
from ...wiring import Node
from .finding import Finding


def releases(node: Node) -> list[Finding]:
    """Every stored release hashed whole against its digest (bit rot included), each shared file
    once, and what the store takes on disk. A damaged selected release cannot start (the node is
    down), and a damaged last-good is no way back. Both fail with their own fix; any other damaged
    release fails with the fix for a stored one."""
    releases, unit = node.releases, node.paths.agent_unit_name
    selected, last_good = releases.selected(), releases.last_good()
    versions = releases.versions()
    out = []
    seen: Hashed = {}  # a file several releases share is read once
    for role, version in (("selected", selected), ("last-good", last_good)):
        if version is None or (role == "last-good" and version == selected):
            continue
        try:
            problem = releases.integrity(version, seen).problem
            if problem is None and not releases.exists(version):
                problem = f"it is not in {node.paths.releases_dir}"
        except ReleaseError as exc:  # a pointer at no release: `state dir entries` says more
            problem = str(exc)
        if problem is None:
            continue
        fix = f"add release {version} again (`agent-fsm release add DIR`, DIR: its directory or " \
              "image; it replaces the damaged copy)"
        if role == "selected":
            fix += f", then `systemctl restart {unit}`" + (
                f"; or switch back to the last-good: `agent-fsm activate --to {last_good}`"
                if last_good not in (None, version) else "")
        out.append(Finding("release", "fail", f"the {role} release {version} is damaged: "
                           f"{problem}" + (": the agent cannot start it" if role == "selected"
                                           else ": the way back runs its code"), fix))
    if not out and selected is not None:
        out.append(Finding("release", "ok", "the selected" + (
            " and last-good releases match their digests" if last_good not in (None, selected)
            else " release matches its digest")))
    if not versions:
        return out
    for version in versions:
        if version in (selected, last_good):
            continue
        problem = releases.integrity(version, seen).problem
        if problem is not None:
            out.append(Finding("release", "fail", f"release {version} is DAMAGED: {problem}",
                               f"add it again (`agent-fsm release add DIR`, DIR: release "
                               f"{version}'s directory), or `agent-fsm release prune {version}` "
                               "if nothing needs it"))
    damaged = sum(f.level == "fail" for f in out)
    return [Finding("releases", "warn" if damaged else "ok",
                    f"{len(versions)} stored" + (f", {damaged} damaged" if damaged else "")
                    + "; each file kept once however many releases hold it"), *out]


def store(node: Node) -> Finding:
    """What the store takes on disk (walked, not the record `status` reads) and the room left. Fails
    when less is free than the way back keeps."""
    where = node.paths.releases_dir
    seen = usage.store_bytes(where)
    if not seen.short:
        return Finding("store", "ok", seen.words())
    return Finding("store", "fail", seen.words(),
                   f"free space on the file system of {node.paths.state_dir}, or remove releases "
                   "nothing needs: `agent-fsm release prune --dry-run` says what it frees")
