"""A user who is not root running a command on root's node is told, in one line, to run it as
root, through the full command line and the fast path alike, never a raw `[Errno 13]`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import make_world

ROOT = Path(__file__).resolve().parents[2]
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="runs a command as uid 65534 (needs root and setpriv)")


@pytest.fixture(scope="module")
def node() -> Iterator[tuple[Path, Path]]:
    """root's installed node and a config file uid 65534 can read: below /var/tmp, as pytest's
    own temporary directories are root's alone."""
    base = Path(tempfile.mkdtemp(prefix="agent-fsm-needs-root-", dir="/var/tmp"))
    try:
        base.chmod(0o755)
        make_world(base / "root").installed("1.0.0")
        cfg = base / "config.toml"
        cfg.write_text('name = "agent"\n')
        cfg.chmod(0o644)
        yield cfg, base / "root"
    finally:
        shutil.rmtree(base)


def _as_nobody(cfg: Path, root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [*NOBODY, sys.executable, "-m", "agent_fsm", "--config", str(cfg), "--root",
            str(root), *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": "/nonexistent"}
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
def test_one_line_saying_run_it_as_root(node: tuple[Path, Path], args: tuple[str, ...],
                                        command: str) -> None:
    """Each command run by uid 65534 on root's node exits 1 with one line: the command needs
    root, what was denied, and the same command line under sudo."""
    cfg, root = node
    done = _as_nobody(cfg, root, *args)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Errno" not in lines[0] and "Traceback" not in done.stderr
    assert lines[0].startswith(f"agent-fsm: {command} needs root (")
    assert lines[0].endswith(f": run it as root (sudo agent-fsm --config {cfg} --root {root} "
                             f"{' '.join(args)})")
