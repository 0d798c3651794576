"""A user who is not root running a command on root's node is told, in one line, to run it as
root, through the full command line and the fast path alike, never a raw `[Errno 13]`.

uid 65534 runs agent-fsm as a node's users do: a packed release's launcher with the node's
python3, from a directory it may read. Not from this checkout, which may be one it cannot (a
clone in root's 0700 home).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent_fsm.actions.releases.packing import pack
from tests.helpers import make_world

NODE_PYTHON = Path("/usr/bin/python3")  # the launcher's default: the config names none
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

pytestmark = [
    pytest.mark.xdist_group("needs-root"),  # its module fixture (a packed release) is made once
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                       reason="runs a command as uid 65534 (needs root and setpriv)"),
    pytest.mark.skipif(not NODE_PYTHON.exists(), reason=f"no {NODE_PYTHON} on this machine"),
]


@dataclass(frozen=True)
class Node:
    launcher: Path
    config: Path
    root: Path


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    """root's installed node, a config file and a packed release uid 65534 can read: below
    /var/tmp, as pytest's own temporary directories are root's alone."""
    base = Path(tempfile.mkdtemp(prefix="agent-fsm-needs-root-", dir="/var/tmp"))
    try:
        base.chmod(0o755)
        release = pack("1.0.0", base / "release")
        make_world(base / "root").installed("1.0.0")
        cfg = base / "config.toml"
        cfg.write_text('name = "agent"\n')
        cfg.chmod(0o644)
        yield Node(release / "bin" / "agent-fsm", cfg, base / "root")
    finally:
        shutil.rmtree(base)


def _as_nobody(node: Node, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [*NOBODY, str(node.launcher), "--config", str(node.config), "--root", str(node.root),
            *args]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HOME": "/nonexistent"}
    return subprocess.run(argv, cwd="/", env=env, capture_output=True, text=True, timeout=60,
                          check=False)


@pytest.mark.parametrize(("args", "command"), [
    (("status",), "status"),
    (("status", "--json"), "status"),  # the fast path
    (("daemon",), "daemon"),  # the fast path
    (("history",), "history"),
    (("doctor",), "doctor"),
    (("release", "list"), "release list"),
    (("upgrade", "--to", "1.0.0"), "upgrade"),
    (("hold", "--reason", "maintenance"), "hold"),
])
def test_one_line_saying_run_it_as_root(node: Node, args: tuple[str, ...], command: str) -> None:
    """Each command run by uid 65534 on root's node exits 1 with one line: the command needs
    root, what was denied, and the same command line under sudo."""
    cfg, root = node.config, node.root
    done = _as_nobody(node, *args)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Errno" not in lines[0] and "Traceback" not in done.stderr
    assert lines[0].startswith(f"agent-fsm: {command} needs root (")
    assert lines[0].endswith(f": run it as root (sudo agent-fsm --config {cfg} --root {root} "
                             f"{' '.join(args)})")
