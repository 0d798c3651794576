"""A dead publisher's way out, and `status` reading the units, in a private systemd 252.

The first test upgrades to a good candidate with the Lab's publisher failing (`publish-fails`):
the node must leave `judged_ok` within the documented bound (`publish_give_up_seconds` plus one
try of the publish command) with no command run by hand, the result queued and said so, and
delivered once the publisher is back. The second leaves both units failed (a candidate that
crashes at every start, a recovery unit that fails) and reads `status`. Every wait is bounded.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from agent_fsm_lab.lab import RECOVERY_UNIT, UNIT, Lab, output, wait_until
from agent_fsm_lab.sandbox import SystemdSandbox

pytestmark = [pytest.mark.e2e]
if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark.append(pytest.mark.timeout(120))  # a safety net only: every wait here is bounded

GIVE_UP = 4.0  # publish_give_up_seconds in these tests
PUBLISH_TIMEOUT = 30.0  # one try of the publish command (RecordPublisher's timeout)


def _entry(history: list[dict[str, Any]], trigger: str, since: float) -> dict[str, Any]:
    found = [h for h in history if h["trigger"] == trigger and h["time"] >= since]
    assert found, f"no {trigger} since {since}: {[h['trigger'] for h in history]}"
    return found[-1]


def test_dead_publisher_opens_the_gate_within_the_bound_and_delivers_later(
        systemd_sandbox: SystemdSandbox) -> None:
    """With the publisher failing, a good upgrade waits for it `publish_give_up_seconds`,
    then converges on the candidate by itself (`upgrade --wait` exits 0, gate open, no
    signal), the result queued and marked with since when the publisher was unreachable; once
    the publisher is back the daemon delivers it, without a command run by hand."""
    lab = Lab(systemd_sandbox, faults=True, deadline=3, soak=1,
              config_extra={"publish_give_up_seconds": GIVE_UP})
    lab.pack("1.0.0")
    lab.install("1.0.0")
    lab.pack("2.0.0")
    lab.fault("publish-fails")
    up = lab.cli("upgrade", "--to", "2.0.0", "--wait", "--timeout", "60", check=False,
                 timeout=75)
    assert up.returncode == 0, output(up) + lab.why()
    end = lab.settled(timeout=15)
    assert (end["selected"], end["last_good"], end["signal"], end["gate"]) == (
        "2.0.0", "2.0.0", None, "open")

    history = lab.history()
    judged = _entry(history, "judge_ok", 0)
    queued = _entry(history, "complete_queued", judged["time"])
    # `complete` did not happen (superseded: recorded as judged_ok -> judged_ok), its way out did.
    after = [(h["trigger"], h["from"], h["to"]) for h in history if h["time"] >= judged["time"]]
    assert after == [("judge_ok", "candidate_running", "judged_ok"),
                     ("complete", "judged_ok", "judged_ok"),
                     ("complete_queued", "judged_ok", "converged")], after
    # The seed's order for the bound, then the way out within the documented bound.
    waited = queued["time"] - judged["time"]
    assert GIVE_UP <= waited <= GIVE_UP + PUBLISH_TIMEOUT, f"left judged_ok after {waited:.1f}s"

    result = end["last_result"]
    assert (result["to"], result["outcome"]) == ("2.0.0", "ok")
    assert result["publisher_unreachable_since"] == pytest.approx(judged["time"], abs=1)
    assert end["outbox"]["queued"] == 1
    assert "publisher unreachable since" in end["situation"]
    assert "publisher unreachable since" in lab.cli("status").stdout
    assert not lab.published()

    lab.fault("publish-fails", on=False)

    def delivered() -> bool:
        return any(r["to"] == "2.0.0" and r["outcome"] == "ok"
                   and r.get("publisher_unreachable_since") for r in lab.published())

    assert wait_until(delivered, 45, interval=0.5), f"published: {lab.published()}" + lab.why()
    assert wait_until(lambda: lab.status()["outbox"]["queued"] == 0, 10)
    assert lab.status()["selected"] == "2.0.0"


def test_status_names_both_failed_units(systemd_sandbox: SystemdSandbox) -> None:
    """A candidate that crashes at every start and a recovery unit that fails leave both
    units failed while the state file still says "being judged": `status` says both failed and
    nothing retries, `next` is `agent-fsm recover`, not "wait for the judgment"."""
    lab = Lab(systemd_sandbox, deadline=3, soak=1, max_attempts=2, restart=0.5)
    lab.pack("1.0.0")
    lab.install("1.0.0")
    lab.pack("2.0.0", "crash")
    # Both can be failed only with a start limit on the agent unit, as a held unit of a release
    # from before the start check has (this one's restarts the agent for ever).
    lab.dropin(UNIT, "older-start-limit", "[Unit]\nStartLimitIntervalSec=300\n"
               "StartLimitBurst=2\n")
    lab.dropin(RECOVERY_UNIT, "test-broken", "[Service]\nExecStart=\nExecStart=/bin/sh -c "
               "'echo recovery broken by the test >&2; exit 1'\nRestart=no\n")
    lab.cli("upgrade", "--to", "2.0.0")

    def both_failed() -> bool:
        return all(lab.sb.show(u, "ActiveState") == "failed" for u in (UNIT, RECOVERY_UNIT))

    lab.sb.wait_for(both_failed, 40, "both units to fail", units=(UNIT, RECOVERY_UNIT))
    st = lab.status()
    assert st["state"] == "candidate_running", lab.why()
    assert st["unit_situation"] == "both_failed", lab.why()
    assert st["units"]["agent"]["active"] == st["units"]["recovery"]["active"] == "failed"
    assert f"{UNIT} is failed" in st["situation"] and f"{RECOVERY_UNIT} is failed" in st["situation"]
    assert "nothing retries" in st["situation"]
    assert st["next"]["commands"][0].endswith(" recover")
    assert "wait for the judgment" not in st["next"]["summary"]
    human = lab.cli("status").stdout
    assert "the way back stopped" in human and "wait for the judgment" not in human
