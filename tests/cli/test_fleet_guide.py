"""docs/fleet.md's release engineer's walk-through runs as written: every `sh channel` block in
order, in one directory, with this checkout's agent-fsm and real ssh-keygen keys; the channel it
leaves is what the guide says, and the node's config block is one agent-fsm reads."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from agent_fsm.node import config as config_mod

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "fleet.md"
pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None,
                                reason="needs OpenSSH's ssh-keygen (Debian: openssh-client)")


def test_the_walk_through_runs_as_written(tmp_path: Path) -> None:
    """Keys, init, pack, publish at 0 %, rollout to 100 %, revoke, refresh and rotate: each
    block exits 0, and the channel ends with 1.1.0 revoked at 100 % and root version 2."""
    blocks = re.findall(r"^```sh channel\n(.*?)^```", GUIDE.read_text(), re.M | re.S)
    assert len(blocks) >= 5
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "agent-fsm"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m agent_fsm "$@"\n')
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "AGENT_FSM_CONFIG"}
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    env["PYTHONPATH"] = str(ROOT)
    for block in blocks:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, env=env,
                              text=True, capture_output=True, timeout=180, check=False)
        assert done.returncode == 0, f"{block}\n{done.stdout}\n{done.stderr}"
    shown = subprocess.run([str(shim), "channel", "show", "./stable", "--json"], cwd=tmp_path,
                           env=env, text=True, capture_output=True, timeout=60, check=True)
    data = json.loads(shown.stdout)
    (entry,) = data["index"]["releases"]
    assert entry["version"] == "1.1.0" and entry["rollout"] == 100
    assert entry["revoked"] == "leaks memory under load"
    assert data["root"]["version"] == 2 and data["root"]["roles"]["index"]["keys"] == ["backup"]


def test_the_nodes_config_block_is_read_as_written() -> None:
    """The guide's `[channel]` block is a config agent-fsm reads, with the values it names."""
    block = re.search(r"^```toml\n(\[channel\]\n.*?)^```", GUIDE.read_text(), re.M | re.S)
    assert block is not None
    cfg = config_mod.parse(tomllib.loads(block.group(1)), Path("guide"))
    assert cfg.channel.url == "https://updates.example.com/agent/stable"
    assert cfg.channel.window == "hourly"
