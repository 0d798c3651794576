"""Making and adding releases: `release pack`, `release add`, `release prune`.

A packed release runs on its own: `lib/agent_fsm` is a copy of the package that packed it,
`bin/agent-fsm` runs it with the interpreter (and so the dependencies) that packed it, and
`assets/` holds its templates of the service assets.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from .. import files
from ..errors import ReleaseError
from ..node import assets
from ..node.releases import check_version, read_manifest
from ..wiring import Node

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # the agent_fsm package

LAUNCHER = """#!/bin/sh
# agent-fsm release {version}: runs this release's own copy of agent-fsm.
here=$(dirname "$(readlink -f "$0")")
PYTHONPATH="$here/../lib${{PYTHONPATH:+:$PYTHONPATH}}" exec {python} -m agent_fsm "$@"
"""


def _ignore(_dir: str, names: list[str]) -> list[str]:
    return [n for n in names if n in ("__pycache__",) or n.endswith(".pyc")]


def pack(version: str, output: Path, workload: tuple[str, ...] = ()) -> Path:
    """Write a release directory for `version` at `output` (which must not exist yet)."""
    check_version(version)
    if output.exists():
        raise ReleaseError(f"{output} already exists; pack into a new directory")
    tmp = output.with_name(f".{output.name}.packing")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "bin").mkdir(parents=True)
    # Links are followed: the copy holds the definition itself (`agent_fsm/states`).
    shutil.copytree(PACKAGE_DIR, tmp / "lib" / "agent_fsm", ignore=_ignore)
    shutil.copytree(PACKAGE_DIR / "templates", tmp / "assets")
    launcher = tmp / "bin" / "agent-fsm"
    launcher.write_text(LAUNCHER.format(version=version, python=shlex.quote(sys.executable)))
    launcher.chmod(0o755)
    manifest = f'version = "{version}"\n'
    if workload:
        manifest += "workload = [" + ", ".join(_toml_str(a) for a in workload) + "]\n"
    (tmp / "release.toml").write_text(manifest)
    os.replace(tmp, output)
    return output


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class Added:
    version: str
    path: Path
    already: bool


def validate(directory: Path, node: Node) -> str:
    """Check a release directory before it is stored; return its version."""
    manifest = directory / "release.toml"
    try:
        version = read_manifest(manifest).version
    except FileNotFoundError:
        raise ReleaseError(f"{directory} is not a release: {manifest} is missing") from None
    launcher = directory / "bin" / "agent-fsm"
    if not os.access(launcher, os.X_OK):
        raise ReleaseError(f"release {version} has no executable {launcher}")
    assets.render(directory, node.paths, version)  # its templates must render for this host
    return version


def add(directory: Path, node: Node) -> Added:
    """Validate a release directory and store it as `<state_dir>/releases/<version>/`."""
    version = validate(directory, node)
    releases = node.host.releases
    target = releases.path(version)
    if target.exists():
        return Added(version, target, already=True)
    tmp = target.with_name(f".{version}.adding")
    shutil.rmtree(tmp, ignore_errors=True)
    files.ensure_dir(target.parent)
    shutil.copytree(directory, tmp, symlinks=True)
    os.replace(tmp, target)
    files.fsync_dir(target.parent)
    releases.manifest(version)
    return Added(version, target, already=False)


def prune(node: Node) -> list[str]:
    """Remove stored releases except the selected, the last-good and a pending upgrade's."""
    host = node.host
    removed = []
    with node.store.locked():  # no upgrade may select a release while it is being removed
        keep = {host.releases.selected(), host.releases.last_good()}
        sig = host.signal()
        if sig is not None:
            keep |= {sig.from_version, sig.to_version}
        for version in host.releases.versions():
            if version not in keep:
                shutil.rmtree(host.releases.path(version))
                removed.append(version)
    return removed
