"""The lab's commands end to end: the demo (`make demo`) tells the story it promises, and `try`
takes a user's own releases and config through a throwaway node and leaves nothing behind."""

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
    assert "upgrade --to 2.0.0 --wait: exit 0, judged ok" in out
    assert "upgrade --to 3.0.0 --wait: exit 4, agent.service failed 2 start(s)" in out
    assert "byte for byte as before the broken upgrade" in out
    assert "way back: 1.0.0 killed at each of its 2 start(s): exit 4, rolled back, the node " \
        "back on 2.0.0" in out
    assert ("final: converged, selected 2.0.0, last-good 2.0.0, gate open, signal none (no "
            "upgrade pending), last result 1.0.0 rolled back") in " ".join(out.split())


def test_try_takes_your_releases_through_a_throwaway_node(can_boot_sandbox: None,
                                                          tmp_path: Path) -> None:
    """`try` with a user's config and releases (packed with a payload and a workload) installs
    the first, judges the upgrade to the second under that config, rolls back a candidate killed
    at each start, prints the timeline, and removes the node's directory."""
    from agent_fsm.actions.releases import packing

    payload = tmp_path / "build"
    payload.mkdir()
    (payload / "agent.sh").write_text('#!/bin/sh\necho "up $AGENT_FSM_VERSION"\nexec sleep 600\n')
    (payload / "agent.sh").chmod(0o755)
    releases = [packing.pack(v, tmp_path / f"rel-{v}", ("{payload_dir}/agent.sh",),
                             payload=payload) for v in ("1.0.0", "1.1.0")]
    config = tmp_path / "node.toml"
    config.write_text('name = "mine"\n[judgment]\ndeadline_seconds = 5\nsoak_seconds = 2\n'
                      'max_attempts = 2\nchecks = [["/bin/sh", "-c", "test 2 -gt 1"]]\n')
    proc = subprocess.run([sys.executable, "-m", "agent_fsm_lab", "try", "--config", str(config),
                           *map(str, releases)], capture_output=True, text=True, timeout=300,
                          check=False, cwd=Path(__file__).resolve().parents[2],
                          env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "added 1.0.0, 1.1.0" in out and "installed 1.0.0: converged, gate open" in out
    assert "upgrade --to 1.1.0 --wait: exit 0, judged ok" in out
    assert "stayed up for the soak" in out
    assert "way back: 1.0.0 killed at each of its 2 start(s): exit 4, rolled back, the node " \
        "back on 1.1.0" in out
    assert "complete" in out and "recovered" in out  # the timeline's triggers
    booted = Path(out.split(" in ", 1)[1].split()[0])  # "booted a private systemd … in DIR"
    assert booted.name.startswith("agent-fsm-e2e-") and not booted.exists()
