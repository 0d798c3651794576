"""The judgment and the way back as systemd runs them, end to end in a
private systemd 252: only the last-good's code runs the way back, a start is the restart it owed,
judgment on a monotonic clock (a wall-clock step preloaded into the agent unit only, never the
host's clock), and a stop or a reboot during judgment is no verdict. Every wait is bounded.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any

import pytest

from agent_fsm_lab import clockshift
from agent_fsm_lab.lab import RECOVERY_UNIT, UNIT, Lab, installed, output, wait_until
from agent_fsm_lab.sandbox import SystemdSandbox
from tests.e2e.conftest import require_sandbox

pytestmark = [pytest.mark.e2e]
if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark.append(pytest.mark.timeout(120))  # a safety net only: every wait is bounded


def _since(lab: Lab, t0: float) -> list[dict[str, Any]]:
    return [h for h in lab.history() if h["time"] >= t0]


def _attempt(lab: Lab) -> int:
    return int((lab.status()["signal"] or {}).get("attempt") or 0)


def _recovery_ran(lab: Lab) -> bool:
    return lab.sb.show(RECOVERY_UNIT, "ExecMainStartTimestampMonotonic") not in ("", "0")


# Item 4 -------------------------------------------------------------------------------------
def test_a_candidate_started_while_rolling_back_never_fires_recovered(
        systemd_sandbox: SystemdSandbox) -> None:
    """With systemctl slow to answer, the failed candidate's `Restart=` start resolves
    `selected` before `recover` moves it and waits for the writers' lock `recover` holds: its
    process (whose own code would render the units broken) leaves the state alone, whether it
    reads it once it is `recovering` and hands over, or hears the stop of `recover`'s restart
    while it waits, and the last-good's start fires `recovered`: converged on the last-good with
    its assets byte for byte, the agent active."""
    lab = installed(systemd_sandbox, faults=True)
    last_good = lab.assets()
    lab.pack("3.0.0", "racing")
    t0 = time.time()
    proc = lab.cli("upgrade", "--to", "3.0.0", timeout=30)
    assert wait_until(lambda: _attempt(lab) >= 1, 15), output(proc) + lab.why()
    # Before its judgment ends (3 s): systemctl turns slow, and the next start of the candidate
    # resolves `selected`, then waits until `recover` moved it.
    # recover asks systemd why the unit failed: it moves `selected` late (the candidate's start
    # check asks `show` too, at once)
    lab.slow("show", 2, recovery_only=True)
    lab.slow("restart", 3)  # and holds the writers' lock while its restart is queued
    lab.fault("hold-start")
    end = lab.settled(timeout=45)
    assert (end["selected"], end["last_good"], end["signal"]) == ("1.0.0", "1.0.0", None)
    assert end["last_result"]["outcome"] == "rolled_back"
    assert lab.assets() == last_good, "the candidate's code ran the way back" + lab.why()
    journal = lab.sb.journal(UNIT)
    met = ("the daemon of release 3.0.0 (the candidate) may not fire recovered",
           "stopping on request: a stop came while waiting for")  # the lock `recover` held
    assert any(line in journal for line in met), (
        "the candidate's start never met the rollback: the race did not happen" + lab.why())
    assert [h["trigger"] for h in _since(lab, t0)].count("recovered") == 1


# Item 5, and an operator's command that died ------------------------------------------------
def test_an_upgrade_killed_before_its_restart_is_judged_by_the_start_the_daemon_makes(
        systemd_sandbox: SystemdSandbox) -> None:
    """`agent-fsm upgrade` SIGKILLed between its write-ahead and its restart, and no command
    run by hand: the serving last-good's daemon finds the upgrade owed with the writers' lock
    free and restarts its unit; that start is the owed restart, so the candidate is judged
    once, converges, and is neither rolled back nor marked known bad."""
    lab = installed(systemd_sandbox)
    lab.pack("2.0.0")
    t0 = time.time()
    crash = lab.cli("upgrade", "--to", "2.0.0", check=False, timeout=30,
                    env={"AGENT_FSM_FAILPOINT": "begin_upgrade:6"})  # before restart_unit
    assert crash.returncode != 0, output(crash)
    end = lab.settled(timeout=30)
    assert (end["selected"], end["last_good"]) == ("2.0.0", "2.0.0"), lab.why()
    assert end["last_result"]["outcome"] == "ok" and end["known_bad"] == []
    triggers = [h["trigger"] for h in _since(lab, t0)]
    assert triggers.count("candidate_started") == 1, triggers
    assert not {"judge_failed", "recover", "recovered"} & set(triggers)
    assert not _recovery_ran(lab)
    assert "the command that ran it is gone" in lab.sb.journal(UNIT), lab.why()


def test_an_upgrade_killed_before_it_selects_is_abandoned_with_no_command_by_hand(
        systemd_sandbox: SystemdSandbox) -> None:
    """`agent-fsm upgrade` SIGKILLed after it shut the gate and wrote its signal, before it
    selected the candidate (a lost ssh session, an OOM): with no command run by hand the node
    is back on 1.0.0 with the gate open and no signal within the daemon's look, the upgrade
    abandoned by the serving daemon itself (its unit never restarted: the same main pid) and
    2.0.0 not marked known bad; the next `upgrade` is not refused."""
    lab = installed(systemd_sandbox)
    lab.pack("2.0.0")
    serving = lab.main_pid()
    t0 = time.time()
    crash = lab.cli("upgrade", "--to", "2.0.0", check=False, timeout=30,
                    env={"AGENT_FSM_FAILPOINT": "begin_upgrade:4"})  # before select_release
    assert crash.returncode != 0, output(crash)
    end = lab.settled(timeout=30)
    assert (end["selected"], end["last_good"], end["signal"]) == ("1.0.0", "1.0.0", None)
    assert end["known_bad"] == [], end
    triggers = [h["trigger"] for h in _since(lab, t0)]
    assert "abandon_upgrade" in triggers and "candidate_started" not in triggers, triggers
    assert lab.main_pid() == serving, lab.why()
    assert "finished an operator's begin_upgrade" in lab.sb.journal(UNIT), lab.why()
    again = lab.cli("upgrade", "--to", "2.0.0", "--wait", "--timeout", "30", check=False,
                    timeout=45)
    assert again.returncode == 0, output(again) + lab.why()


# Item 6 -------------------------------------------------------------------------------------
def _clock_step(lab: Lab) -> Path:
    """Preload the lab's wall-clock step into the agent unit (a drop-in); returns the file whose
    whole seconds ("+3600") shift the unit's wall clock, read at every call: its monotonic clock
    and sleeps stay real, as across an NTP step (agent_fsm_lab/clockshift.c)."""
    missing = clockshift.missing()
    if missing is not None:
        require_sandbox(missing, what="the clock-step tests need")
    shift = lab.dir / "clock-shift"
    shift.write_text("+0\n")
    lab.dropin(UNIT, "lab-clock-step", clockshift.dropin(clockshift.build(lab.dir), shift))
    return shift


def test_a_clock_step_during_the_soak_does_not_judge_early(
        systemd_sandbox: SystemdSandbox) -> None:
    """The wall clock of the agent unit (only: a preloaded clock step, a drop-in) steps +1 h two seconds
    into a 20 s soak; the candidate's workload dies 6 s after it started. The soak is not over
    at the step: the candidate is judged failed and the node rolls back."""
    lab = installed(systemd_sandbox, soak=20)
    stamp = _clock_step(lab)
    health = lab.health
    lab.pack("2.0.0", workload=("/bin/sh", "-c",
                                f'echo "$AGENT_FSM_VERSION" > {health}; sleep 6; exit 1'))
    upgrade = lab.cli("upgrade", "--to", "2.0.0", timeout=30)
    assert wait_until(lambda: health.exists() and health.read_text().strip() == "2.0.0", 15), \
        output(upgrade) + lab.why()
    time.sleep(2)  # into the soak
    stamp.write_text("+3600\n")  # the agent unit's clock; this process's is untouched
    end = lab.settled(timeout=40)
    assert (end["selected"], end["last_good"]) == ("1.0.0", "1.0.0"), lab.why()
    assert end["last_result"]["outcome"] == "rolled_back"
    failed = [h for h in lab.history() if h["trigger"] == "judge_failed"]
    assert failed and "during the soak" in str(failed[-1].get("reason")), failed
    assert failed[-1]["time"] > time.time() + 3000, "the agent unit's clock never stepped"
    assert not any(h["trigger"] == "judge_ok" for h in lab.history())


def test_a_clock_step_back_during_the_soak_does_not_stretch_it(
        systemd_sandbox: SystemdSandbox) -> None:
    """The agent unit's wall clock steps back 1 h one second into a 5 s soak of a good
    candidate: the soak still ends after 5 s, well inside the unit's start timeout, and the
    candidate converges, neither rolled back nor restarted."""
    lab = installed(systemd_sandbox, soak=5)
    stamp = _clock_step(lab)
    health = lab.health
    lab.pack("2.0.0")
    t0 = time.time()
    upgrade = lab.cli("upgrade", "--to", "2.0.0", timeout=30)
    assert wait_until(lambda: health.exists() and health.read_text().strip() == "2.0.0", 15), \
        output(upgrade) + lab.why()
    time.sleep(1)  # into the soak
    stamp.write_text("-3600\n")
    end = lab.settled(timeout=30)
    assert (end["selected"], end["last_good"]) == ("2.0.0", "2.0.0"), lab.why()
    assert end["last_result"]["outcome"] == "ok"
    starts = [h for h in lab.history() if h["trigger"] == "candidate_started"
              and h["time"] >= t0 - 7200]
    assert len(starts) == 1, starts
    assert not _recovery_ran(lab)


# Item 7 -------------------------------------------------------------------------------------
def test_a_stop_or_a_reboot_during_judgment_is_no_verdict(
        systemd_sandbox: SystemdSandbox) -> None:
    """`systemctl stop` during the judgment, then a start, then a reboot of the private systemd
    over the same disk during the next judgment: neither is a verdict (the signal stays,
    nothing recorded, nothing marked bad, no recovery); after the boot the candidate is judged
    a third time and converges."""
    lab = installed(systemd_sandbox, soak=8, max_attempts=3)
    before = lab.status()["last_result"]
    lab.pack("2.0.0")
    lab.cli("upgrade", "--to", "2.0.0", timeout=30)

    def stopped_while_judging(attempt: int, stop: Any) -> None:
        assert wait_until(lambda: _attempt(lab) >= attempt, 15), lab.why()
        time.sleep(1)  # into the soak
        stop()
        status = lab.status()
        assert status["state"] == "candidate_running", status
        assert status["signal"] and status["signal"]["attempt"] == attempt, status
        assert status["known_bad"] == [] and status["last_result"] == before, status
        assert not _recovery_ran(lab), lab.why()

    def stop_unit() -> None:
        lab.sb.systemctl("stop", UNIT)
        assert lab.sb.show(UNIT, "Result") == "success", lab.why()

    stopped_while_judging(1, stop_unit)
    lab.sb.systemctl("start", "--no-block", UNIT)
    stopped_while_judging(2, lab.sb.reboot)
    assert (lab.state_dir / "state.json").exists()  # the same disk
    lab.sb.systemctl("start", "--no-block", UNIT)  # as the boot would: the target is the lab's
    end = lab.settled(timeout=40)
    assert (end["selected"], end["last_good"]) == ("2.0.0", "2.0.0"), lab.why()
    assert end["last_result"]["outcome"] == "ok" and end["known_bad"] == []
    starts = [h for h in lab.history() if h["trigger"] == "candidate_started"]
    assert len(starts) == 3, starts


# HTTP checks -------------------------------------------------------------------------------
# A release's workload: a tiny HTTP server answering /healthz with the status it is given.
HEALTH_SERVER = """
import http.server, sys
port, code = int(sys.argv[1]), int(sys.argv[2])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(code if self.path == "/healthz" else 404)
        self.end_headers()
        self.wfile.write(b"down for maintenance\\n" if code != 200 else b"ok\\n")
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def test_an_http_check_rolls_back_a_503_and_passes_a_200(
        systemd_sandbox: SystemdSandbox) -> None:
    """With `{ http = ".../healthz", status = 200 }` as the check, done by the daemon itself: a
    candidate answering 503 is rolled back, its recorded reason saying what was expected and
    what came; one answering 200 converges."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/healthz"
    lab = Lab(systemd_sandbox, deadline=3, soak=1,
              checks=f'[{{ http = "{url}", status = 200, timeout_seconds = 1 }}]')

    server = lab.dir / "health_server.py"
    server.write_text(HEALTH_SERVER)

    def pack(version: str, code: int) -> None:
        lab.pack(version, workload=("/usr/bin/python3", str(server), str(port), str(code)))

    pack("1.0.0", 200)
    lab.install("1.0.0")
    pack("2.0.0", 503)
    failed = lab.cli("upgrade", "--to", "2.0.0", "--wait", "--timeout", "40", check=False)
    assert failed.returncode == 4, output(failed) + lab.why()
    result = lab.settled()["last_result"]
    assert (result["outcome"], result["reason_class"]) == ("rolled_back", "check_failed")
    assert f"GET {url}: expected 200, got 503: \"down for maintenance\"" in result["reason"], result
    pack("3.0.0", 200)
    lab.cli("upgrade", "--to", "3.0.0", "--wait", "--timeout", "40")
    end = lab.settled()
    assert (end["selected"], end["last_good"], end["last_result"]["outcome"]) == (
        "3.0.0", "3.0.0", "ok"), lab.why()
