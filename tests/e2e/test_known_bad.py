"""Known-bad versions and reasons end to end, in a private systemd 252: why each rollback
happened as `status --json` shows it (a crash at start, as systemd saw it; a failed check), a
rolled-back version refused by the next upgrade, and accepted with --force."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest

from agent_fsm_lab.lab import RECOVERY_UNIT, UNIT, Lab
from agent_fsm_lab.sandbox import SystemdSandbox

pytestmark = [pytest.mark.e2e]
if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark.append(pytest.mark.timeout(150))  # a safety net only: every wait here is bounded


def _why(lab: Lab) -> str:
    return lab.sb.diagnostics(UNIT, RECOVERY_UNIT)


def test_reasons_then_known_bad_refused_then_forced(systemd_sandbox: SystemdSandbox) -> None:
    """On one node: 3.0.0 exits 3 at every start (crashed: its starts used up, as the start
    check counted them, and its restarts read by the recovery unit from systemd); 2.0.0 fails
    its check (check_failed, the check named); the next upgrade to 2.0.0 is refused (exit 3,
    one line); fixed and re-added, `--force` upgrades to it, judged ok, and its mark is gone."""
    lab = Lab(systemd_sandbox, deadline=2, soak=0.5)
    lab.pack("1.0.0")
    lab.install("1.0.0")

    lab.pack("3.0.0", "crash")
    proc = lab.cli("upgrade", "--to", "3.0.0", "--wait", "--timeout", "40", check=False)
    assert proc.returncode == 4, proc.stdout + proc.stderr + _why(lab)
    result = lab.settled()["last_result"]
    assert result["reason_class"] == "crashed", result
    # Its starts used up, the last-good's start check refused the next one and started recovery.
    assert "failed 2 start(s) in a row (max_attempts)" in result["reason"], result
    assert "start check refused" in result["reason"] and "restarted" in result["reason"], result

    lab.pack("2.0.0", "unhealthy")
    proc = lab.cli("upgrade", "--to", "2.0.0", "--wait", "--timeout", "40", check=False)
    assert proc.returncode == 4, proc.stdout + proc.stderr + _why(lab)
    st = lab.settled()
    result = st["last_result"]
    assert (result["outcome"], result["reason_class"]) == ("rolled_back", "check_failed")
    assert "checks still failing at the deadline: /bin/sh exited 1" in result["reason"]
    assert [(k["version"], k["reason_class"]) for k in st["known_bad"]] == [
        ("3.0.0", "crashed"), ("2.0.0", "check_failed")]

    refused = lab.cli("upgrade", "--to", "2.0.0", check=False)
    assert refused.returncode == 3, refused.stdout + refused.stderr
    line, = refused.stderr.strip().splitlines()
    assert "known bad" in line and "--force" in line and "check_failed" in line

    # The operator fixes 2.0.0: the broken one pruned (not protected), a good one added.
    lab.cli("release", "prune", "2.0.0")
    shutil.rmtree(lab.packs / "2.0.0")
    lab.pack("2.0.0")
    listed = {r["version"]: r for r in json.loads(lab.cli("release", "list", "--json").stdout)}
    assert listed["2.0.0"]["known_bad"]["reason_class"] == "check_failed"
    forced = lab.cli("upgrade", "--to", "2.0.0", "--force", "--wait", "--timeout", "40",
                     check=False)
    assert forced.returncode == 0, forced.stdout + forced.stderr + _why(lab)
    assert "going past the known-bad mark of 2.0.0" in forced.stdout
    end = lab.settled()
    assert end["selected"] == "2.0.0" and [k["version"] for k in end["known_bad"]] == ["3.0.0"]
    assert (end["last_result"]["outcome"], end["last_result"]["reason_class"]) == ("ok", "passed")
