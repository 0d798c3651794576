"""The demo (`make demo`: `python -m agent_fsm_lab demo`) works end to end and tells the story it
promises."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def test_demo_rolls_back_the_broken_upgrade(can_boot_sandbox: None) -> None:
    """The demo installs 1.0.0, upgrades to 2.0.0, survives the broken 3.0.0 and ends on 2.0.0
    with its assets byte for byte, its last line in words (no `None`, no `rolled_back`)."""
    proc = subprocess.run([sys.executable, "-m", "agent_fsm_lab", "demo"], capture_output=True,
                          text=True, timeout=300, check=False,
                          cwd=Path(__file__).resolve().parents[2],
                          env={**os.environ, "COLUMNS": "120"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "upgrade --to 2.0.0 --wait   (exit 0)" in out
    assert "upgrade --to 3.0.0 --wait   (exit 4)" in out
    assert "byte for byte as before the broken upgrade" in out
    assert ("final: converged, selected 2.0.0, last-good 2.0.0, gate open, signal none (no "
            "upgrade pending), last result 3.0.0 rolled back") in " ".join(out.split())
