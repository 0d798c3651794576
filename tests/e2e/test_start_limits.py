"""Start limits as agent-fsm's policy, through a real systemd: a converged agent that crashes is
restarted for ever and never rolled back, and a candidate that crashes at start reaches recovery
after max_attempts starts however often something else reloads systemd.

Each runs on both systemds (`node_sandbox`: the host's 252 and the Debian 13 node's 257): the
unit is rendered for the systemd that runs it, and nothing here depends on a reload's side
effect, which is what changed between them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent_fsm_lab.lab import NAME, RECOVERY_UNIT, UNIT, Lab, wait_until
from agent_fsm_lab.sandbox import SystemdSandbox

pytestmark = pytest.mark.e2e

STORM_UNIT = "reload-storm.service"
# What the lab's crashing candidate prints each time its code runs (lab.py, kind "crash").
CANDIDATE_RAN = "candidate crashes at start"


def _why(lab: Lab) -> str:
    return lab.sb.diagnostics(UNIT, RECOVERY_UNIT)


def _systemd_version(sb: SystemdSandbox) -> int:
    return int(sb.run("systemctl", "--version").stdout.split()[1])


@pytest.fixture
def reload_storm(node_sandbox: SystemdSandbox) -> Iterator[None]:
    """Another tenant of the host reloading systemd every 0.5 s (config management, another
    agent crash-looping), as a unit of the sandbox: started here, stopped after the test."""
    node_sandbox.write_unit(STORM_UNIT, "[Unit]\nDescription=daemon-reload every 0.5 s\n"
                               "DefaultDependencies=no\n\n[Service]\nExecStart=/bin/sh -c "
                               "'while :; do systemctl daemon-reload; echo reloaded; "
                               "sleep 0.5; done'\n")
    node_sandbox.systemctl("start", STORM_UNIT)
    yield
    node_sandbox.systemctl("stop", STORM_UNIT, check=False)


def test_a_converged_agent_killed_again_and_again_is_restarted_and_never_rolled_back(
        node_sandbox: SystemdSandbox) -> None:
    """A converged agent killed with SIGKILL five times in a row is restarted by systemd each
    time (never left failed, recovery never started, still on its release), its history has
    one crash-loop entry counting the five restarts, and status says it is crash-looping."""
    lab = Lab(node_sandbox, restart=0.2, max_attempts=2)
    lab.pack("1.0.0")
    lab.install("1.0.0")
    before = lab.history()
    kills = 5
    for _ in range(kills):
        pid = lab.main_pid()
        lab.sb.run("kill", "-9", str(pid))
        assert wait_until(lambda pid=pid: lab.main_pid() not in (0, pid), 60), _why(lab)
        lab.settled()
    assert lab.sb.show(UNIT, "NRestarts") == str(kills)
    assert lab.sb.show(RECOVERY_UNIT, "ExecMainStartTimestampMonotonic") == "0", _why(lab)
    end = lab.status()
    assert (end["selected"], end["last_good"], end["last_result"]) == ("1.0.0", "1.0.0", None)
    history = lab.history()
    assert len(history) == len(before) + 1, history[len(before):]
    loop = history[-1]
    assert (loop["trigger"], loop["restarts"]) == ("settle", kills), loop
    assert end["crash_loop"]["restarts"] == kills
    assert lab.cli("status").stdout.count("crash-looping: 5 restarts since") >= 1
    # The unit was written for this systemd: no key it does not know.
    assert "Unknown key" not in lab.sb.journal(), _why(lab)
    if _systemd_version(lab.sb) >= 254:
        assert lab.sb.show(UNIT, "RestartSteps") == "6"
        assert lab.sb.show(UNIT, "RestartMode") == "direct"  # so OnFailure= waits for good


def test_a_crashing_candidate_reaches_recovery_after_max_attempts_during_a_reload_storm(
        node_sandbox: SystemdSandbox, reload_storm: None) -> None:
    """While systemd is reloaded every 0.5 s, a candidate that crashes at start (before its own
    daemon counts anything) runs exactly max_attempts times, then the last-good's start check
    starts recovery and the node rolls back to the last-good."""
    lab = Lab(node_sandbox, restart=0.2, max_attempts=3)
    lab.pack("1.0.0")
    lab.install("1.0.0")
    lab.pack("3.0.0", "crash")
    proc = lab.cli("upgrade", "--to", "3.0.0", "--wait", "--timeout", "90", check=False)
    assert proc.returncode == 4, proc.stdout + proc.stderr + _why(lab)
    end = lab.settled()
    assert (end["selected"], end["last_good"]) == ("1.0.0", "1.0.0")
    assert end["last_result"]["outcome"] == "rolled_back"
    journal = lab.sb.journal(UNIT)
    assert journal.count(CANDIDATE_RAN) == 3, journal
    assert "more than max_attempts (3): starting" in journal, journal
    storm = lab.sb.journal(STORM_UNIT)
    assert storm.count("reloaded") >= 6, storm  # the storm did blow throughout
    assert lab.sb.show(f"{NAME}.service", "ActiveState") == "active"


def test_a_rollback_whose_reset_is_refused_on_a_unit_with_a_start_limit_still_converges(
        node_sandbox: SystemdSandbox) -> None:
    """On an agent unit that has a start limit again (a drop-in, as older releases wrote it;
    a burst of one start in 15 s) with `systemctl reset-failed` refused on the way back, systemd
    refuses the rollback's restart and leaves the unit failed: the recovery unit's `recover`
    fails and is tried again until the interval has passed, and the node converges on the
    last-good, instead of staying failed in `recovering`."""
    import threading

    from agent_fsm_lab.lab import installed

    lab = installed(node_sandbox, faults=True, max_attempts=3)
    lab.dropin(UNIT, "lab-start-limit", "[Unit]\nStartLimitIntervalSec=15\nStartLimitBurst=1\n")
    lab.pack("3.0.0", "unhealthy")
    done: list[object] = []
    upgrade = threading.Thread(target=lambda: done.append(lab.cli(
        "upgrade", "--to", "3.0.0", "--wait", "--timeout", "60", check=False, timeout=75)),
        daemon=True)
    upgrade.start()
    assert wait_until(lambda: int((lab.status()["signal"] or {}).get("attempt") or 0) >= 1,
                      15), _why(lab)
    lab.fault("refuse-reset-failed")  # the upgrade's own reset worked; the way back's is refused
    upgrade.join(80)
    assert done and getattr(done[0], "returncode", None) == 4, f"{done}" + _why(lab)
    end = lab.settled(timeout=30)
    assert (end["selected"], end["last_good"], end["signal"]) == ("1.0.0", "1.0.0", None)
    journal = lab.sb.journal()
    assert "Start request repeated too quickly" in journal, _why(lab)  # the restart refused
    assert "but systemd did not start agent.service" in journal, _why(lab)  # and tried again
