"""An upgrade is judged under the config the operator wrote, on systemd 252 and 257
(`node_sandbox`): a deadline raised after install is the one systemd's start timeout follows for
the candidate."""

from __future__ import annotations

import importlib.util
import re

import pytest

from agent_fsm_lab.lab import UNIT, Lab, output
from agent_fsm_lab.sandbox import SystemdSandbox

pytestmark = [pytest.mark.e2e]
if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark.append(pytest.mark.timeout(180))  # a safety net only: every wait is bounded

# Installed with a 1 s deadline and soak: the agent unit's TimeoutStartSec= is 12 (1 + 1 + 10).
INSTALLED_TIMEOUT = 12
SLOW_TO_HEALTH = INSTALLED_TIMEOUT + 1  # seconds the good candidate's workload needs
SLOW_WORKLOAD = ("/bin/sh", "-c", f"sleep {SLOW_TO_HEALTH}; "
                 'echo "$AGENT_FSM_VERSION" > "$AGENT_FSM_RELEASE_DIR/../../../health.d/health"; '
                 "exec sleep infinity")


def _installed(sandbox: SystemdSandbox, **options: object) -> Lab:
    lab = Lab(sandbox, deadline=1, soak=1, **options)  # type: ignore[arg-type]
    lab.pack("1.0.0")
    lab.install("1.0.0")
    assert lab.sb.show(UNIT, "TimeoutStartUSec") == f"{INSTALLED_TIMEOUT}s"
    return lab


def _raise_deadline(lab: Lab, seconds: int) -> None:
    """The operator's edit of the config: `[judgment] deadline_seconds` raised, nothing else."""
    text = lab.config.read_text()
    lab.config.write_text(re.sub(r"(?m)^deadline_seconds = .*$",
                                 f"deadline_seconds = {seconds}", text))


def test_a_deadline_raised_after_install_judges_a_slow_good_candidate_ok(
        node_sandbox: SystemdSandbox) -> None:
    """A good candidate that needs longer than the installed start timeout to be healthy,
    upgraded to after the operator raised the deadline: the held unit has the new timeout, the
    candidate is judged ok and converges, nothing rolled back or marked known bad."""
    lab = _installed(node_sandbox)
    _raise_deadline(lab, 16)
    lab.pack("2.0.0", workload=SLOW_WORKLOAD)
    proc = lab.cli("upgrade", "--to", "2.0.0", "--wait", "--timeout", "60", check=False,
                   timeout=90)
    assert proc.returncode == 0, output(proc) + lab.why()
    end = lab.settled(timeout=30)
    assert (end["selected"], end["last_good"]) == ("2.0.0", "2.0.0"), lab.why()
    assert end["last_result"]["outcome"] == "ok" and end["known_bad"] == [], end
    assert lab.sb.show(UNIT, "TimeoutStartUSec") == "27s"  # 16 + 1 + 10
