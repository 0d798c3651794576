"""What agent-fsm keeps, nothing else writes; and the way back never strands on one damaged
file: end to end on a node of each kind (systemd 252, and 257 on Debian 13).

The releases here ship a payload whose `data/shared.log` is the same in every version, so the
store keeps it once (one file, a name in each release). The good agent says it is healthy in
the lab's health file; the appending one (a candidate) appends a line to that shared file and
to the state dir, notes how each try ended, and exits 1: judged failed. The last test damages
a file of the last-good in place, as a bad disk would, while the candidate is judged.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest

from agent_fsm_lab.lab import RECOVERY_UNIT, Lab, output
from agent_fsm_lab.sandbox import SystemdSandbox

pytestmark = [pytest.mark.e2e]
if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark.append(pytest.mark.timeout(240))  # a safety net only: every wait is bounded

WORKLOAD = '/bin/sh -c \'exec "$AGENT_FSM_PAYLOAD_DIR/bin/agent.sh"\''
HEALTH = '"$AGENT_FSM_RELEASE_DIR/../../../health.d"'  # the lab's health.d, from the store
GOOD = """#!/bin/sh
# The user's agent {version}: healthy.
echo "$AGENT_FSM_VERSION" > {health}/health
exec sleep infinity
"""
APPENDING = """#!/bin/sh
# The user's agent {version}: appends to a file it ships and to the state dir, then fails.
try() {{ if sh -c "$2" 2>/dev/null; then echo "$1=written"; else echo "$1=refused"; fi; }}
{{
  try shipped 'echo appended >> data/shared.log'
  try state 'echo appended >> "$AGENT_FSM_RELEASE_DIR/../../state.json"'
}} > {health}/tries
exit 1
"""
UNHEALTHY = """#!/bin/sh
# The user's agent {version}: never says it is healthy.
exec sleep infinity
"""


def _pack(lab: Lab, version: str, script: str) -> None:
    src = lab.dir / "src" / version
    shutil.rmtree(src, ignore_errors=True)
    (src / "bin").mkdir(parents=True)
    (src / "data").mkdir()
    (src / "data" / "shared.log").write_bytes(b"shipped\n")
    agent = src / "bin" / "agent.sh"
    agent.write_text(script.format(version=version, health=HEALTH))
    agent.chmod(0o755)
    out = lab.packs / version
    proc = lab.cli("release", "pack", "--version", version, "--output", str(out),
                   "--payload", str(src), "--workload", WORKLOAD, check=False)
    assert proc.returncode == 0, output(proc)
    lab.cli("release", "add", str(out))


def _shared(lab: Lab, version: str) -> Path:
    return lab.state_dir / "releases" / version / "payload" / "data" / "shared.log"


def _intact(lab: Lab) -> dict[str, object]:
    return {r["version"]: r["intact"] for r in json.loads(lab.cli("release", "list",
                                                                  "--json").stdout)}


def test_a_candidate_appending_to_a_shared_file_leaves_the_last_good_whole(
        node_sandbox: SystemdSandbox) -> None:
    """A candidate whose workload (root) appends to a file it ships identically with the
    last-good, and to the state dir, is refused both writes, fails its judgment, and the node
    rolls back by itself to the last-good, whose file is byte for byte what was stored;
    `release list` and `doctor` report no damage."""
    lab = Lab(node_sandbox, deadline=4, soak=1)
    _pack(lab, "1.0.0", GOOD)
    lab.install("1.0.0")
    _pack(lab, "2.0.0", APPENDING)
    assert os.stat(_shared(lab, "1.0.0")).st_ino == os.stat(_shared(lab, "2.0.0")).st_ino
    upgrade = lab.cli("upgrade", "--to", "2.0.0", "--wait", "--timeout", "90", check=False,
                      timeout=120)
    assert upgrade.returncode == 4, output(upgrade) + lab.why()
    status = lab.settled(60)
    assert (status["selected"], status["last_good"]) == ("1.0.0", "1.0.0"), lab.why()
    assert status["last_result"]["outcome"] == "rolled_back"
    assert status["way_back"] is None  # nothing was damaged, nothing mended
    tries = (lab.health.parent / "tries").read_text().split()
    assert tries == ["shipped=refused", "state=refused"], tries
    assert _shared(lab, "1.0.0").read_bytes() == b"shipped\n"
    assert _intact(lab) == {"1.0.0": True, "2.0.0": True}
    doctor = lab.cli("doctor", check=False)
    assert "changed content" not in doctor.stdout and "DAMAGED" not in doctor.stdout, \
        output(doctor)


def test_a_last_good_damaged_at_the_rollback_falls_back_to_an_intact_known_good(
        node_sandbox: SystemdSandbox) -> None:
    """The last-good's own agent script damaged in place (no intact copy anywhere) while a
    candidate is judged: the way back falls back to the newest intact known-good release,
    which the node converges on by itself; status, the result and the recovery unit's journal
    say it fell back."""
    lab = Lab(node_sandbox, deadline=5, soak=1)
    _pack(lab, "1.0.0", GOOD)
    lab.install("1.0.0")
    _pack(lab, "2.0.0", GOOD)
    upgrade = lab.cli("upgrade", "--to", "2.0.0", "--wait", "--timeout", "90", check=False,
                      timeout=120)
    assert upgrade.returncode == 0, output(upgrade) + lab.why()
    lab.settled(60)
    _pack(lab, "3.0.0", UNHEALTHY)
    lab.cli("upgrade", "--to", "3.0.0")  # judged failed at its deadline, 5 s on
    with (lab.state_dir / "releases" / "2.0.0" / "payload" / "bin" / "agent.sh").open("r+b") as f:
        f.seek(2)  # a bad disk: other bytes in place, the same file
        f.write(b"X")
    status = lab.settled(90)
    assert (status["selected"], status["last_good"]) == ("1.0.0", "1.0.0"), lab.why()
    way = status["way_back"]
    assert way is not None and (way["action"], way["release"], way["to"]) == \
        ("fell_back", "2.0.0", "1.0.0"), status
    assert "payload/bin/agent.sh changed content" in way["reason"]
    assert "fell back to 1.0.0" in status["last_result"]["way_back"]
    assert (status["last_result"]["to"], status["last_result"]["outcome"]) == \
        ("3.0.0", "rolled_back")
    assert "was damaged beyond repair" in lab.sb.journal(RECOVERY_UNIT), lab.why()
    assert lab.health.read_text() == "1.0.0\n"  # 1.0.0's workload runs
    doctor = lab.cli("doctor", check=False)
    assert "last-good 2.0.0 was damaged beyond repair" in doctor.stdout, output(doctor)
