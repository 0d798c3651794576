"""Another local user and a disk that refuses a removal, for the staging tests: a directory that
uid 65534 can reach, a process run as that user, and files made immutable (chattr +i), which
even root cannot remove, undone after the test."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

NOBODY = 65534
_AS_NOBODY = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")
PYTHON = "/usr/bin/python3"  # the host's: the checkout's venv may be out of nobody's reach


def needs_root() -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv(1): the test runs a process as another user")


def as_nobody(*argv: str) -> subprocess.Popen[str]:
    """Start `argv` as uid and gid 65534, no groups, no capabilities."""
    return subprocess.Popen([*_AS_NOBODY, *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def run_as_nobody(script: str, *args: str, timeout: float = 30) -> str:
    """Run the Python `script` (the host's python3) as uid 65534; its stdout. Fails the test
    when it fails."""
    proc = as_nobody(PYTHON, "-c", script, *args)
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return out


@pytest.fixture
def shared() -> Iterator[Path]:
    """A new directory below /var/tmp (0755 parents: uid 65534 can reach it), removed after."""
    needs_root()
    top = Path("/var/tmp") / f"agent-fsm-test.{os.urandom(6).hex()}"
    top.mkdir(0o755)
    os.chmod(top, 0o755)
    try:
        yield top
    finally:
        unstick(top)
        shutil.rmtree(top)


def stick(path: Path) -> None:
    """Make `path` immutable: no one, root included, can remove it or the directory it is in."""
    subprocess.run(["chattr", "+i", str(path)], check=True, capture_output=True, timeout=10)


def unstick(top: Path) -> None:
    subprocess.run(["chattr", "-R", "-i", str(top)], capture_output=True, timeout=60, check=False)


@pytest.fixture
def sticking(tmp_path: Path) -> Iterator[None]:
    """Files below tmp_path may be made immutable (`stick`); made mutable again after."""
    probe = tmp_path / ".chattr-probe"
    probe.write_text("")
    if shutil.which("chattr") is None or subprocess.run(
            ["chattr", "+i", str(probe)], capture_output=True, timeout=10).returncode != 0:
        pytest.skip(f"the file system of {tmp_path} has no immutable files (chattr +i)")
    try:
        yield
    finally:
        unstick(tmp_path)
        probe.unlink()
