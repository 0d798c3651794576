"""A real Ansible rolls agent-fsm out across four private-systemd nodes: canary, batches, rollback.

The four nodes are booted once for the module (booting and rolling out is the cost; each step
builds on the fleet the previous one left) and reached with ``community.docker.nsenter``. Each
step runs the collection's playbook ``agent_fsm.fleet.rollout`` and reads every node back
through ``agent-fsm status --json``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from agent_fsm_lab.fleet import Fleet, PlaybookRun, ansible_playbook
from tests.e2e.conftest import require_sandbox

pytestmark = pytest.mark.e2e

PLAYBOOK = "agent_fsm.fleet.rollout"
PLAY = "PLAY [Roll agent-fsm out, a canary first, then batches]"


def _require() -> None:
    """Skip when this machine cannot boot nodes or has no Ansible; fail instead in CI."""
    require_sandbox(*([] if ansible_playbook() else
                      ["ansible-playbook next to this Python (pip install -e '.[test]')"]),
                    what="the fleet e2e test needs")


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    """Four booted nodes n1..n4 with nothing installed; all shut down whatever happens."""
    _require()
    fleet = Fleet(4)
    try:
        fleet.boot()
        yield fleet
    finally:
        fleet.shutdown()


def _rollout(fleet: Fleet, version: str, *args: str) -> PlaybookRun:
    src = fleet.dir / "packs" / version
    if not src.exists():
        fleet.pack(version)
    return fleet.playbook(PLAYBOOK, *args, agent_fsm_version=version,
                          agent_fsm_release_src=str(src), agent_fsm_timeout=60)


def _view(status: dict[str, Any], history: int) -> dict[str, Any]:
    """What a rollout may change on a node (not the clock)."""
    keys = ("state", "selected", "last_good", "candidate", "releases", "gate", "signal", "last_result")
    return {**{k: status[k] for k in keys}, "history": history}


def _views(fleet: Fleet) -> dict[str, dict[str, Any]]:
    return fleet.each(lambda lab: _view(lab.status(), len(lab.history())))


def test_canary_rollout_across_four_nodes(fleet: Fleet) -> None:
    """Idle nodes are bootstrapped; a good release reaches all four, a canary first; the same run
    again changes nothing; --check --diff shows the change and makes none; a release that fails
    its health check on one node of the second batch rolls that node back, fails the play with a
    recap naming it, and the last batch is never touched."""
    nodes = fleet.names
    took: dict[str, float] = {}

    # 1. Bootstrap, all in one batch: nodes with nothing installed get 1.0.0, installed by the
    # release's own agent-fsm.
    assert {s["state"] for s in fleet.status().values()} == {"idle"}
    run = _rollout(fleet, "1.0.0", "-e", '{"rollout_serial": ["100%"]}')
    took["bootstrap"] = run.seconds
    assert run.returncode == 0, run.output
    for name, status in fleet.status().items():
        assert (status["state"], status["selected"], status["last_good"], status["gate"]) == (
            "converged", "1.0.0", "1.0.0", "open"), (name, status, run.output)
    assert all(counts["changed"] >= 2 for counts in run.recap().values()), run.output

    # 2. An all-good rollout, in three batches (canary n1, then n2, then n3 and n4).
    run = _rollout(fleet, "2.0.0")
    took["rollout"] = run.seconds
    assert run.returncode == 0, run.output
    assert run.output.count(PLAY) == 3, run.output
    assert "moved (4): n1, n2, n3, n4" in run.output
    for name, status in fleet.status().items():
        assert (status["state"], status["selected"], status["last_good"]) == (
            "converged", "2.0.0", "2.0.0"), (name, status)
        assert (status["last_result"]["to"], status["last_result"]["outcome"]) == ("2.0.0", "ok")
    settled = _views(fleet)

    # 3. The same run again: nothing to do on any node, and nothing done.
    run = _rollout(fleet, "2.0.0")
    took["again"] = run.seconds
    assert run.returncode == 0, run.output
    changed = {name: counts["changed"] for name, counts in run.recap().items()}
    assert changed == dict.fromkeys(nodes, 0), run.output
    assert "unchanged (4): n1, n2, n3, n4" in run.output
    assert _views(fleet) == settled

    # 4. --check --diff of 3.0.0, in one batch: every node says it would move and shows how;
    # none moves, and nothing is copied.
    run = _rollout(fleet, "3.0.0", "--check", "--diff", "-e", '{"rollout_serial": ["100%"]}')
    took["check"] = run.seconds
    assert run.returncode == 0, run.output
    assert all(counts["changed"] >= 1 for counts in run.recap().values()), run.output
    assert run.output.count("-version: 2.0.0\n+version: 3.0.0") == 4, run.output
    assert "would move (4): n1, n2, n3, n4" in run.output
    assert _views(fleet) == settled

    # 5. 3.0.0 fails its health check on n3, in the second batch (n2 and n3; the batches are
    # given so that one failure out of two must stop the play: a batch whose every node failed
    # stops it whatever the failure budget): n2 moves, n3 rolls back, the play stops, n4 is
    # never reached.
    fleet.unhealthy("n3")
    run = _rollout(fleet, "3.0.0", "-e", '{"rollout_serial": [1, 2, "100%"]}')
    took["rollback"] = run.seconds
    assert run.returncode != 0, run.output
    assert run.output.count(PLAY) == 2, run.output
    recap = run.recap()
    assert set(recap) == {"n1", "n2", "n3"}, run.output  # n4 was never reached
    assert [recap[n]["failed"] for n in ("n1", "n2", "n3")] == [0, 0, 1], run.output
    for line in ("moved (2): n1, n2", "rolled back (1): n3", "not reached (1): n4", "n3 rolled back"):
        assert line in run.output, run.output
    after = fleet.status()
    for name in ("n1", "n2"):
        assert (after[name]["state"], after[name]["selected"]) == ("converged", "3.0.0"), after[name]
    n3 = fleet.labs["n3"].settled()
    assert (n3["selected"], n3["last_good"]) == ("2.0.0", "2.0.0"), n3
    assert (n3["last_result"]["to"], n3["last_result"]["outcome"]) == ("3.0.0", "rolled_back")
    assert _views(fleet)["n4"] == settled["n4"]  # not even the release was copied
    print("fleet steps (s):", {k: round(v, 1) for k, v in took.items()},
          "total", round(sum(took.values()), 1), time.strftime("%H:%M:%S"))
