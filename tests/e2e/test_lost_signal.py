"""A lost signal, end to end: a candidate whose check deletes its upgrade signal while it is
judged, on systemd 252 and on a Debian 13 node's 257 (`node_sandbox`). The node rolls back to
the last-good by itself, within a bound, without a crash loop and without a traceback, and
`status` says the upgrade rolled back because its signal was lost."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import signal
import time
from typing import Any

import pytest

from agent_fsm_lab.lab import RECOVERY_UNIT, UNIT, Lab, output, wait_until
from agent_fsm_lab.sandbox import SystemdSandbox

pytestmark = [pytest.mark.e2e]
if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark.append(pytest.mark.timeout(150))  # a safety net only: every wait here is bounded

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 2
BACK_WITHIN = 45.0  # seconds from `upgrade` to the last-good converged again


def _rolled_back_by_itself(lab: Lab, t0: float, what: str) -> dict[str, Any]:
    """Wait (at most BACK_WITHIN seconds) for the node to converge on 1.0.0 after the upgrade
    to 2.0.0, sampling the agent unit's NRestarts; check what an operator would see then."""
    most_restarts = 0
    end: dict[str, Any] = {}

    def back() -> bool:
        nonlocal end, most_restarts
        most_restarts = max(most_restarts, int(lab.sb.show(UNIT, "NRestarts") or 0))
        end = lab.status()
        return (end["state"] == "converged" and end["gate"] == "open" and end["signal"] is None
                and end["owed"] is None and (end["last_result"] or {}).get("to") == "2.0.0"
                and lab.sb.show(UNIT, "ActiveState") == "active")

    lab.sb.wait_for(back, BACK_WITHIN, "the node to roll back to 1.0.0 by itself",
                    units=(UNIT, RECOVERY_UNIT))
    log.warning("lost signal (%s): back on the last-good %.1fs after `upgrade`, the agent unit "
                "restarted at most %d time(s)", what, time.monotonic() - t0, most_restarts)
    assert (end["selected"], end["last_good"]) == ("1.0.0", "1.0.0"), end
    result = end["last_result"]
    assert result["outcome"] == "rolled_back", result
    assert "upgrade signal was lost" in result["reason"], result
    assert most_restarts < MAX_ATTEMPTS + 3, f"{most_restarts} restarts" + lab.why()
    for unit in (UNIT, RECOVERY_UNIT):
        assert "Traceback" not in lab.sb.journal(unit), lab.why()
    shown = lab.cli("status", check=False, timeout=30)
    assert "signal was lost" in shown.stdout, output(shown)
    return end


def test_a_check_that_deletes_the_signal_rolls_back_by_itself(
        node_sandbox: SystemdSandbox) -> None:
    """The candidate's check deletes the signal (and passes): the node converges on the
    last-good without an operator, the agent unit restarted only a few times, no traceback in
    either unit's journal, and `status` shows the upgrade rolled back, its signal lost."""
    state_dir = node_sandbox.test_dir / "state"  # the Lab's (agent_fsm/node/paths.py names)
    signal_file = state_dir / "upgrade-signal.json"
    health = node_sandbox.test_dir / "health.d" / "health"  # the Lab's (Lab.health)
    check = (f'if [ "$AGENT_FSM_VERSION" = 2.0.0 ]; then rm -f {signal_file}; fi; '
             f'test "$(cat {health} 2>/dev/null)" = "$AGENT_FSM_VERSION"')
    lab = Lab(node_sandbox, deadline=4, soak=1, max_attempts=MAX_ATTEMPTS,
              checks=f'[["/bin/sh", "-c", {json.dumps(check)}]]')
    lab.pack("1.0.0")
    lab.install("1.0.0")
    lab.pack("2.0.0")
    t0 = time.monotonic()
    lab.cli("upgrade", "--to", "2.0.0", timeout=30)
    _rolled_back_by_itself(lab, t0, "deleted by a check")


def test_a_candidate_restarted_after_its_signal_was_deleted_rolls_back_by_itself(
        node_sandbox: SystemdSandbox) -> None:
    """The signal deleted while the candidate is judged (an operator, a disk), then the
    candidate's daemon killed: its restarts do not crash-loop, the last-good's start check
    refuses them and starts recovery, and the node converges on the last-good by itself."""
    lab = Lab(node_sandbox, deadline=10, soak=60, max_attempts=MAX_ATTEMPTS)
    lab.pack("1.0.0")
    lab.install("1.0.0")
    lab.pack("2.0.0")
    t0 = time.monotonic()
    lab.cli("upgrade", "--to", "2.0.0", timeout=30)
    assert wait_until(lambda: (lab.status()["signal"] or {}).get("attempt", 0) >= 1, 20), \
        lab.why()
    (lab.state_dir / "upgrade-signal.json").unlink()
    os.kill(lab.sb.host_pid(lab.main_pid()), signal.SIGKILL)
    _rolled_back_by_itself(lab, t0, "deleted, then the candidate killed")
