"""The way back depends only on the last-good and the host, end to end.

Once a candidate is judged failed, crashes or is abandoned, the path recovery unit -> recovery
script -> last-good's `recover` -> restart -> last-good's daemon -> `recovered` must never wait
on the publisher, never need `systemctl reset-failed` to succeed, never read the candidate's
release or templates, and never have to finish an effect the candidate's path left owed; a
signal is never resolved by accepting an unjudged candidate. Each test below breaks one of those
in a private systemd 252 (faults from the Lab's fault kit, see agent_fsm_lab/lab.py) and checks
what an operator would see; the core of them (the publisher down, reset-failed refused on the way
back, a missing recovery script, an upgrade killed in begin_upgrade) on a Debian 13 node's
systemd 257 too (`node_sandbox`). Every wait is bounded, so each test ends within about a
minute even when the code under test never converges.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agent_fsm_lab.lab import NAME, RECOVERY_UNIT, UNIT, Lab, installed, output, wait_until
from agent_fsm_lab.sandbox import SystemdSandbox

pytestmark = [pytest.mark.e2e]
if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark.append(pytest.mark.timeout(150))  # a safety net only: every wait here is bounded

SCRIPT = f"{NAME}-recovery.sh"
ROLLBACK_TRIGGERS = {"judge_failed", "recover", "recovered"}


# Helpers ------------------------------------------------------------------------------------
def _triggers(lab: Lab, since: float) -> list[str]:
    return [h["trigger"] for h in lab.history() if h["time"] >= since]


def _signal_attempt(lab: Lab) -> int:
    return int((lab.status()["signal"] or {}).get("attempt") or 0)


@contextlib.contextmanager
def _daemon_frozen(lab: Lab) -> Iterator[None]:
    """The serving daemon stopped (SIGSTOP) for the block, so that it cannot yet find and
    finish an operator's command that died (it looks every few seconds), then let go."""
    pid = lab.sb.host_pid(lab.main_pid())
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


class Upgrade:
    """`agent-fsm upgrade --to V --wait` in a thread, so that the test can act meanwhile."""

    def __init__(self, lab: Lab, version: str, timeout: float) -> None:
        self.proc: subprocess.CompletedProcess[str] | None = None
        self.error: BaseException | None = None
        self.started = time.time()

        def run() -> None:
            try:
                self.proc = lab.cli("upgrade", "--to", version, "--wait", "--timeout",
                                    str(timeout), check=False, timeout=timeout + 15)
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=run, name=f"upgrade-{version}", daemon=True)
        self.thread.start()

    def result(self, timeout: float) -> subprocess.CompletedProcess[str]:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise AssertionError(f"`upgrade --wait` still running after {timeout}s more")
        if self.error is not None:
            raise self.error
        assert self.proc is not None
        return self.proc


# 1. The publisher is down -------------------------------------------------------------------
def test_publisher_down_failed_candidate_still_rolls_back(
        node_sandbox: SystemdSandbox) -> None:
    """With the publisher down, a candidate that fails its check still rolls back to the
    last-good (gate open, `upgrade --wait` exits 4), and the rolled-back result is delivered
    once the publisher works again, at latest on the last-good's next start."""
    lab = installed(node_sandbox, faults=True)
    last_good = lab.assets()
    lab.pack("3.0.0", "unhealthy")
    lab.fault("publish-fails")
    t0 = time.time()
    proc = lab.cli("upgrade", "--to", "3.0.0", "--wait", "--timeout", "30", check=False,
                   timeout=45)
    assert proc.returncode == 4, output(proc) + lab.why()
    end = lab.settled(timeout=15)
    assert (end["selected"], end["last_good"], end["signal"]) == ("1.0.0", "1.0.0", None)
    assert end["last_result"]["to"] == "3.0.0"
    assert end["last_result"]["outcome"] == "rolled_back"
    assert lab.assets() == last_good
    assert lab.sb.show(RECOVERY_UNIT, "Result") == "success", lab.why()
    triggers = _triggers(lab, t0)
    assert {"judge_failed", "recovered"} <= set(triggers) and "judge_ok" not in triggers

    lab.fault("publish-fails", on=False)
    lab.sb.systemctl("restart", UNIT)  # the last-good's next start: delivered by then at latest

    def delivered() -> bool:
        return any(r["to"] == "3.0.0" and r["outcome"] == "rolled_back"
                   for r in lab.published())

    assert wait_until(delivered, 20), f"published: {lab.published()}" + lab.why()
    assert lab.settled(timeout=15)["selected"] == "1.0.0"


# 2. systemctl reset-failed is refused ------------------------------------------------------
def test_reset_failed_refused_never_leaves_an_upgrade_half_done(
        systemd_sandbox: SystemdSandbox) -> None:
    """With `systemctl reset-failed` refused for every caller, an upgrade to a failing
    candidate either rolls back by itself or is undone by `agent-fsm recover`: the node ends
    converged on the last-good, gate open, no signal, never on the unjudged candidate."""
    lab = installed(systemd_sandbox, faults=True, max_attempts=3)
    last_good = lab.assets()
    lab.pack("3.0.0", "unhealthy")
    lab.fault("refuse-reset-failed")
    up = lab.cli("upgrade", "--to", "3.0.0", "--wait", "--timeout", "30", check=False,
                 timeout=45)
    if up.returncode != 4:  # aborted (or refused): the operator's way back is `recover`
        rec = lab.cli("recover", check=False, timeout=30)
        assert rec.returncode == 0, f"upgrade: {output(up)}\nrecover: {output(rec)}" + lab.why()
    end = lab.settled(timeout=30)
    assert (end["selected"], end["last_good"], end["signal"]) == ("1.0.0", "1.0.0", None)
    assert lab.assets() == last_good
    assert (end["last_result"] or {}).get("outcome") != "ok"


def test_reset_failed_refused_on_the_way_back_still_rolls_back(
        node_sandbox: SystemdSandbox) -> None:
    """With `systemctl reset-failed` refused once the candidate runs (the recovery path meets
    the refusal, the upgrade's own reset worked), a failing candidate still rolls back to the
    last-good: `upgrade --wait` exits 4 and the node converges with the gate open."""
    lab = installed(node_sandbox, faults=True, max_attempts=3)
    last_good = lab.assets()
    lab.pack("3.0.0", "unhealthy")
    upgrade = Upgrade(lab, "3.0.0", timeout=35)
    assert wait_until(lambda: _signal_attempt(lab) >= 1, 15), lab.why()
    lab.fault("refuse-reset-failed")  # before the judgment ends (3 s deadline)
    proc = upgrade.result(55)
    assert proc.returncode == 4, output(proc) + lab.why()
    end = lab.settled(timeout=15)
    assert (end["selected"], end["last_good"], end["signal"]) == ("1.0.0", "1.0.0", None)
    assert end["last_result"]["outcome"] == "rolled_back"
    assert lab.assets() == last_good


# 3. A missing held asset is written from the candidate -------------------------------------
def test_missing_recovery_script_is_restored_from_the_last_good(
        node_sandbox: SystemdSandbox) -> None:
    """A recovery script deleted before an upgrade comes back as the last-good's, byte for
    byte, never as the candidate's: a candidate with broken assets that fails its check rolls
    back through a working script and the node converges on the last-good."""
    lab = installed(node_sandbox)
    last_good = lab.assets()
    (lab.dir / "lib" / SCRIPT).unlink()
    lab.pack("3.0.0", "unhealthy")
    upgrade = Upgrade(lab, "3.0.0", timeout=35)
    assert wait_until(lambda: _signal_attempt(lab) >= 1, 15), lab.why()
    mid = (lab.dir / "lib" / SCRIPT).read_bytes() if (lab.dir / "lib" / SCRIPT).exists() \
        else None
    proc = upgrade.result(55)
    assert mid in (None, last_good[SCRIPT]), (
        f"while the candidate was judged, the recovery script on disk was not the "
        f"last-good's:\n{mid!r}\n" + output(proc) + lab.why())
    assert proc.returncode == 4, output(proc) + lab.why()
    end = lab.settled(timeout=15)
    assert (end["selected"], end["last_good"], end["signal"]) == ("1.0.0", "1.0.0", None)
    assert lab.assets() == last_good
    assert lab.sb.show(RECOVERY_UNIT, "Result") == "success", lab.why()
    assert "broken recovery script" not in lab.sb.journal(RECOVERY_UNIT)


# 4. A signal without an upgrade in the state file ------------------------------------------
def test_state_restored_from_backup_mid_judgment_comes_back_to_last_good(
        systemd_sandbox: SystemdSandbox) -> None:
    """state.json restored from a backup taken while converged, in the middle of a
    candidate's judgment (the signal exists, the state knows no upgrade): the node comes back
    to the last-good with the gate open and never accepts the unjudged candidate."""
    lab = installed(systemd_sandbox, soak=5)
    last_good = lab.assets()
    state_file = lab.state_dir / "state.json"
    backup = lab.dir / "state.json.backup"
    shutil.copy2(state_file, backup)
    lab.pack("2.0.0")  # a good candidate: only its judgment, which is lost, could accept it
    lab.cli("upgrade", "--to", "2.0.0", timeout=30)
    assert wait_until(lambda: _signal_attempt(lab) >= 1, 15), lab.why()
    restoring = lab.state_dir / ".state.json.restoring"
    shutil.copy2(backup, restoring)
    os.replace(restoring, state_file)  # as an operator's restore would, atomically

    seen_last_good: set[str] = set()
    end: dict[str, Any] = {}

    def back() -> bool:
        nonlocal end
        end = lab.status()
        seen_last_good.add(str(end["last_good"]))
        return (end["state"] == "converged" and end["gate"] == "open" and end["signal"] is None
                and end["owed"] is None and lab.sb.show(UNIT, "ActiveState") == "active")

    settled = wait_until(back, 40, interval=0.5)
    assert "2.0.0" not in seen_last_good, f"the unjudged candidate was accepted: {end}"
    assert settled, f"never settled; last status: {end}" + lab.why()
    assert (end["selected"], end["last_good"]) == ("1.0.0", "1.0.0")
    assert lab.assets() == last_good


# 5. release prune after an interrupted upgrade ---------------------------------------------
def test_prune_after_interrupted_upgrade_keeps_what_is_owed(
        node_sandbox: SystemdSandbox) -> None:
    """`release prune` after an upgrade interrupted in begin_upgrade (before the signal) keeps
    the release the owed transition needs, so `recover` and the daemon's next start work and
    the node converges on the last-good."""
    lab = installed(node_sandbox)
    lab.pack("2.0.0")
    with _daemon_frozen(lab):  # else it finishes the dead upgrade before the prune
        crash = lab.cli("upgrade", "--to", "2.0.0", check=False, timeout=30,
                        env={"AGENT_FSM_FAILPOINT": "begin_upgrade:1"})
        assert crash.returncode != 0, output(crash)
        owed = lab.status()["owed"]
        assert owed is not None and owed["trigger"] == "begin_upgrade", owed  # it happened
        prune = lab.cli("release", "prune", check=False, timeout=30)
    rec = lab.cli("recover", check=False, timeout=30)
    assert rec.returncode == 0, f"prune: {output(prune)}\nrecover: {output(rec)}" + lab.why()
    end = lab.settled(timeout=30)
    assert (end["selected"], end["last_good"], end["signal"]) == ("1.0.0", "1.0.0", None)
    stored = lab.cli("release", "list", timeout=30).stdout
    assert "2.0.0" in stored, f"prune removed the owed release: {output(prune)}"
    lab.sb.systemctl("restart", UNIT)  # and the daemon's next start works too
    assert lab.settled(timeout=20)["selected"] == "1.0.0"


# 6. Failing writes or reloads after the judgment -------------------------------------------
def test_recovery_script_not_writable_after_rollback_still_opens_gate(
        systemd_sandbox: SystemdSandbox) -> None:
    """When the last-good's daemon cannot rewrite its assets in `recovered` (the recovery
    script is read-only to the agent unit, by a host drop-in), the rollback still ends:
    converged on the last-good with the gate open and its held assets intact."""
    lab = installed(systemd_sandbox)
    last_good = lab.assets()
    script = lab.dir / "lib" / SCRIPT
    lab.dropin(UNIT, "host-script-read-only", f"[Service]\nReadOnlyPaths=-{script}\n")
    lab.pack("3.0.0", "unhealthy")
    proc = lab.cli("upgrade", "--to", "3.0.0", "--wait", "--timeout", "30", check=False,
                   timeout=45)
    assert proc.returncode == 4, output(proc) + lab.why()
    end = lab.settled(timeout=15)
    assert (end["selected"], end["last_good"], end["signal"]) == ("1.0.0", "1.0.0", None)
    assert lab.assets() == last_good


def test_daemon_reload_refused_after_good_judgment_still_opens_gate(
        systemd_sandbox: SystemdSandbox) -> None:
    """When `systemctl daemon-reload` is refused as a good candidate completes, the upgrade
    still converges on it with the gate open (`upgrade --wait` exits 0), and the next start
    with a working reload settles too."""
    lab = installed(systemd_sandbox, faults=True)
    lab.pack("2.0.0")
    lab.fault("refuse-daemon-reload")
    t0 = time.time()
    proc = lab.cli("upgrade", "--to", "2.0.0", "--wait", "--timeout", "30", check=False,
                   timeout=45)
    assert proc.returncode == 0, output(proc) + lab.why()
    end = lab.settled(timeout=15)
    assert (end["selected"], end["last_good"], end["signal"]) == ("2.0.0", "2.0.0", None)
    assert end["last_result"]["outcome"] == "ok"
    assert not ROLLBACK_TRIGGERS & set(_triggers(lab, t0))
    lab.fault("refuse-daemon-reload", on=False)
    lab.sb.systemctl("restart", UNIT)
    assert lab.settled(timeout=20)["selected"] == "2.0.0"
    assert b"agent-fsm 2.0.0" in lab.asset(UNIT)


# 7. A publisher that never answers ---------------------------------------------------------
def test_hanging_publisher_never_rolls_back_a_good_upgrade(
        node_sandbox: SystemdSandbox) -> None:
    """A publisher that does not answer for longer than the unit's start timeout (twice over)
    never turns a good upgrade into a rollback: once it answers again the node converges on the
    candidate, `upgrade --wait` exits 0 and the ok result is delivered."""
    # TimeoutStartSec = deadline + soak + 10 = 12 s; a short stop timeout (a lab drop-in) lets
    # systemd's kill of a timed-out start, and the restart after it, happen within the test.
    lab = installed(node_sandbox, faults=True, deadline=2, soak=0)
    lab.dropin(UNIT, "lab-short-stop", "[Service]\nTimeoutStopSec=2\n")
    lab.pack("2.0.0")
    lab.fault("publish-hangs")
    upgrade = Upgrade(lab, "2.0.0", timeout=45)
    outage_end = upgrade.started + 34
    selected_seen: list[str] = []  # from the candidate's selection on
    while time.time() < outage_end:
        selected = str(lab.status()["selected"])
        if selected_seen or selected == "2.0.0":
            selected_seen.append(selected)
        time.sleep(0.5)
    lab.fault("publish-hangs", on=False)
    proc = upgrade.result(30)
    recovery_started = lab.sb.show(RECOVERY_UNIT, "ExecMainStartTimestampMonotonic") != "0"
    triggers = _triggers(lab, upgrade.started)
    assert "1.0.0" not in selected_seen and not recovery_started \
        and not ROLLBACK_TRIGGERS & set(triggers), (
            f"the publisher's outage sent a good upgrade down the recovery path: selected "
            f"went {sorted(set(selected_seen))}, recovery unit started: {recovery_started}, "
            f"triggers {triggers}\n" + output(proc) + lab.why())
    assert proc.returncode == 0, output(proc) + lab.why()
    end = lab.settled(timeout=15)
    assert (end["selected"], end["last_good"], end["signal"]) == ("2.0.0", "2.0.0", None)
    assert end["last_result"]["outcome"] == "ok"
    assert any(r["to"] == "2.0.0" and r["outcome"] == "ok" for r in lab.published())


# 8. The recovery unit still trying again when the node has converged ------------------------
def _stopped_in_its_wait(lab: Lab, timeout: float = 30) -> int:
    """SIGSTOP the recovery unit's try that failed while it waits (2 s, growing) before it exits
    for systemd to start it again: stopped there, it cannot try again. It is that try when each
    try started so far (`NRestarts` + 1) has said it failed. Returns its host PID."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid, tries = (int(lab.sb.show(RECOVERY_UNIT, p)) for p in ("MainPID", "NRestarts"))
        failed = lab.sb.journal(RECOVERY_UNIT).count("the recovery unit tries again")
        if pid and failed == tries + 1:
            host_pid = lab.sb.host_pid(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(host_pid, signal.SIGSTOP)
                if int(lab.sb.show(RECOVERY_UNIT, "MainPID")) == pid:
                    return host_pid
                os.kill(host_pid, signal.SIGCONT)
        time.sleep(0.1)
    raise AssertionError(f"no failed try of {RECOVERY_UNIT} waiting within {timeout}s\n"
                         + lab.why())


def test_recovery_still_trying_never_rolls_back_the_next_upgrade(
        node_sandbox: SystemdSandbox) -> None:
    """A recovery unit whose try failed (its restart refused by systemctl) is still at work,
    waiting to try again, when the node has already converged on the last-good by itself (the
    agent unit's own restart started it). An upgrade begun then waits for the recovery unit to
    finish (its next try finds nothing pending) and is judged on its own: it converges, the
    recovery unit never rolls it back, and nothing is marked known bad."""
    # The soak keeps 3.0.0 judged for longer than the stopped try takes to try again once let
    # go (its wait, RestartSec=, a start), so that a roll-back of it would be seen.
    lab = installed(node_sandbox, faults=True, max_attempts=1, soak=5)
    lab.pack("2.0.0", "crash")
    lab.pack("3.0.0")
    lab.cli("upgrade", "--to", "2.0.0", timeout=30)
    lab.fault("refuse-restart")  # the upgrade's own restart is queued already
    waiting = _stopped_in_its_wait(lab)
    try:
        back = lab.settled(timeout=30)  # the last-good's own start converged the node
        assert (back["selected"], back["last_result"]["outcome"]) == ("1.0.0", "rolled_back")
        assert lab.sb.show(RECOVERY_UNIT, "ActiveState") == "activating", lab.why()
        lab.fault("refuse-restart", on=False)
        upgrade = Upgrade(lab, "3.0.0", timeout=60)
        began = wait_until(lambda: lab.status()["state"] != "converged", 2)
    finally:
        os.kill(waiting, signal.SIGCONT)
    proc = upgrade.result(90)
    assert not began, "the upgrade began while the recovery unit was at work\n" + output(proc)
    assert proc.returncode == 0, output(proc) + lab.why()
    assert f"waiting for {RECOVERY_UNIT}" in proc.stdout, output(proc)
    end = lab.settled(timeout=15)
    assert (end["selected"], end["last_good"], end["signal"]) == ("3.0.0", "3.0.0", None)
    assert [bad["version"] for bad in end["known_bad"]] == ["2.0.0"]
    assert "nothing to roll back: no upgrade is pending" in lab.sb.journal(RECOVERY_UNIT)
