"""The way back is live, end to end: once the fault that stopped a rollback is gone,
the node reaches the last-good converged with no command run by hand.

Each test breaks the host while a failing candidate is judged, in a private systemd 252: the state
directory on a small tmpfs of the sandbox's own mount namespace (never the host's), filled, or
remounted read-only; the writers' lock held by another process. While the fault lasts the
candidate's verdict, its restarts and the recovery unit's `recover` fail; the recovery unit's own
restart policy (`Restart=on-failure`, no start limit, a growing wait in `recover`) tries again,
with no agent-fsm process left in the agent unit. Each test removes the fault, then waits, and
logs how long the node took to converge after it. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_fsm.actions.releases import packing
from agent_fsm_lab.lab import RECOVERY_UNIT, UNIT, Lab, wait_until
from agent_fsm_lab.sandbox import SystemdSandbox

pytestmark = [pytest.mark.e2e]
if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark.append(pytest.mark.timeout(150))  # a safety net only: every wait here is bounded

log = logging.getLogger(__name__)
STATE_FS_SIZE = "96m"  # two releases (about 21 MB each), one being added, and the state
FAULT_SECONDS = 12  # how long each fault lasts once the candidate is being judged
LOCK_SECONDS = 8
CONVERGE_WITHIN = 45  # after the fault is gone: the recovery unit's longest wait is 30 s


# Helpers ------------------------------------------------------------------------------------
def _node(sandbox: SystemdSandbox, *, private_state: bool) -> Lab:
    """A node converged on a good 1.0.0 with a failing 3.0.0 stored (judgment: 4 s deadline,
    no soak, 2 attempts); its state directory on a tmpfs of the sandbox when `private_state`."""
    lab = Lab(sandbox, deadline=4, soak=0, max_attempts=2)
    if private_state:
        lab.state_dir.mkdir(mode=0o700)
        sandbox.run("mount", "-t", "tmpfs", "-o", f"size={STATE_FS_SIZE},mode=0700", "tmpfs",
                    str(lab.state_dir))
    lab.pack("1.0.0")
    lab.install("1.0.0")
    lab.pack("3.0.0", "unhealthy")
    return lab


def _judging(lab: Lab) -> None:
    """Start the upgrade to the failing 3.0.0 and wait until its candidate is being judged."""
    lab.cli("upgrade", "--to", "3.0.0", timeout=30)
    assert wait_until(lambda: int((lab.status()["signal"] or {}).get("attempt") or 0) >= 1,
                      15, interval=0.2), lab.why()


def _back_on_last_good(lab: Lab) -> bool:
    st = lab.status()
    return (st["state"] == "converged" and st["gate"] == "open" and st["signal"] is None
            and st["owed"] is None and st["selected"] == "1.0.0"
            and lab.sb.show(UNIT, "ActiveState") == "active")


def _converges_after(lab: Lab, removed: float, what: str,
                     record_property: Any) -> dict[str, Any]:
    """Wait until the node is back on the last-good; log and record how long after `removed`."""
    assert wait_until(lambda: _back_on_last_good(lab), CONVERGE_WITHIN, interval=0.5), (
        f"not back on the last-good {CONVERGE_WITHIN}s after {what} was removed, with no "
        "command run by hand" + lab.why())
    took = time.monotonic() - removed
    log.warning("converged on the last-good %.1fs after %s was removed", took, what)
    record_property("converged_after_fault_seconds", round(took, 1))
    end = lab.status()
    assert end["last_result"]["to"] == "3.0.0"
    assert end["last_result"]["outcome"] == "rolled_back"
    return end


def _rollback_failed_meanwhile(lab: Lab) -> None:
    """While the fault lasts the way back fails: the agent unit has given up (failed) and the
    recovery unit is trying again, or the node is still on the candidate."""
    assert lab.status()["selected"] == "3.0.0", lab.why()


class Inside:
    """A command running inside the sandbox in the background (its process as the host sees
    it is `child`: nsenter's), stopped and ended by the test."""

    def __init__(self, sandbox: SystemdSandbox, *argv: str, env: dict[str, str]) -> None:
        self.proc = sandbox.popen(*argv, env=env)
        self._child: int | None = None

    @property
    def child(self) -> int:
        """The command's own process (nsenter forks it into the sandbox's PID namespace)."""
        if self._child is None:
            path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")

            def forked() -> bool:
                self._child = next((int(p) for p in path.read_text().split()), None) \
                    if path.exists() else None
                return self._child is not None

            assert wait_until(forked, 10, interval=0.005), "the command never started"
        assert self._child is not None
        return self._child

    def resume(self) -> None:
        """Let a stopped command go on: nsenter stopped itself with it, and goes on first."""
        for pid in (self.proc.pid, self.child):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def end(self, timeout: float = 30) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, err

    def kill(self) -> None:
        """End the command (let go first if stopped) and nsenter."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            if self._child is not None:
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self._child, sig)
            self.proc.kill()
            self.proc.wait(timeout=10)  # not its pipes: what it started may keep them open


@pytest.fixture
def started() -> Iterator[list[Inside]]:
    """Background commands a test starts; ended at the end."""
    procs: list[Inside] = []
    yield procs
    for p in procs:
        p.kill()


# 1. The state directory is full -------------------------------------------------------------
def test_full_state_dir_while_judged_converges_once_space_is_freed(
        systemd_sandbox: SystemdSandbox, record_property: Any) -> None:
    """The state directory's file system full while a failing candidate is judged: the
    verdict and the rollback cannot be written, the recovery unit keeps trying, and once space
    is freed the node is back on the last-good, gate open, with no command run by hand."""
    lab = _node(systemd_sandbox, private_state=True)
    last_good = lab.assets()
    _judging(lab)
    filler = lab.state_dir / ".filler"
    fill = lab.sb.run("sh", "-c", f"cat /dev/zero > {filler}", check=False, timeout=30)
    assert "No space left" in fill.stderr, fill.stderr
    assert wait_until(lambda: lab.sb.show(RECOVERY_UNIT, "NRestarts") not in ("", "0"),
                      FAULT_SECONDS + 20, interval=0.5), (
        "the recovery unit did not try again while the disk was full" + lab.why())
    _rollback_failed_meanwhile(lab)
    failed = lab.sb.journal(RECOVERY_UNIT)
    assert "No space left on device" in failed and "free space on the file system" in failed, failed
    assert "Traceback" not in failed + lab.sb.journal(UNIT), lab.why()
    lab.sb.run("rm", "-f", str(filler))
    removed = time.monotonic()
    _converges_after(lab, removed, "the full disk", record_property)
    assert lab.assets() == last_good


# 2. The state directory is read-only ---------------------------------------------------------
def test_read_only_state_dir_while_judged_converges_once_writable(
        systemd_sandbox: SystemdSandbox, record_property: Any) -> None:
    """The state directory's file system remounted read-only while a failing candidate is
    judged: every write of the way back fails with one line naming the path and the fix, the
    recovery unit keeps trying, and once it is writable again the node is back on the
    last-good with no command run by hand."""
    lab = _node(systemd_sandbox, private_state=True)
    last_good = lab.assets()
    _judging(lab)
    lab.sb.run("mount", "-o", "remount,ro", str(lab.state_dir))
    assert wait_until(lambda: lab.sb.show(RECOVERY_UNIT, "NRestarts") not in ("", "0"),
                      FAULT_SECONDS + 20, interval=0.5), (
        "the recovery unit did not try again while the disk was read-only" + lab.why())
    _rollback_failed_meanwhile(lab)
    failed = lab.sb.journal(RECOVERY_UNIT)
    assert "Read-only file system" in failed and "remount the file system of" in failed, failed
    assert "[Errno 30]" not in failed and "Traceback" not in failed + lab.sb.journal(UNIT), \
        lab.why()
    lab.sb.run("mount", "-o", "remount,rw", str(lab.state_dir))
    removed = time.monotonic()
    _converges_after(lab, removed, "the read-only mount", record_property)
    assert lab.assets() == last_good


# 3. The writers' lock is held --------------------------------------------------------------
def _big_release(lab: Lab, version: str) -> Path:
    """A release with a payload large enough that adding it takes a while (48 MiB)."""
    path = packing.pack(version, lab.packs / version)
    (path / "payload").mkdir(exist_ok=True)
    with open(path / "payload" / "blob", "wb") as out:
        out.truncate(48 << 20)
    return path


def test_release_add_stopped_mid_copy_never_blocks_the_way_back(
        systemd_sandbox: SystemdSandbox, started: list[Inside], record_property: Any) -> None:
    """An operator's `release add` suspended mid-copy (Ctrl-Z) while a failing candidate is
    judged never blocks the rollback: it holds no lock while it copies, so the node is back on
    the last-good while it is stopped, and the add finishes once resumed."""
    lab = _node(systemd_sandbox, private_state=False)
    release = _big_release(lab, "2.5.0")
    _judging(lab)
    add = Inside(lab.sb, sys.executable, "-m", "agent_fsm", "--config", str(lab.config),
                 "release", "add", str(release), env=lab.env)
    started.append(add)
    releases = lab.state_dir / "releases"
    assert wait_until(lambda: any(releases.glob(".adding.*")), 20, interval=0.005), \
        "the add never began to copy"
    os.kill(add.child, signal.SIGSTOP)
    stopped = time.monotonic()
    assert wait_until(lambda: _back_on_last_good(lab), CONVERGE_WITHIN, interval=0.5), (
        "the rollback waited behind a `release add` stopped mid-copy" + lab.why())
    log.warning("converged on the last-good %.1fs after the add was stopped",
                time.monotonic() - stopped)
    record_property("converged_while_add_stopped_seconds", round(time.monotonic() - stopped, 1))
    assert lab.status()["last_result"]["outcome"] == "rolled_back"
    add.resume()
    code, out, err = add.end(60)
    assert code == 0, f"exit {code}\n{out}{err}"
    assert "2.5.0" in lab.cli("release", "list", timeout=30).stdout


def test_lock_held_while_judged_converges_once_let_go(
        systemd_sandbox: SystemdSandbox, started: list[Inside], record_property: Any) -> None:
    """Another process holding the writers' lock while a failing candidate is judged: the way
    back waits for it instead of giving up, and once it is let go the node is back on the
    last-good with no command run by hand."""
    lab = _node(systemd_sandbox, private_state=False)
    _judging(lab)
    # `--close`: flock(1) itself holds it (not the sleep it runs), until it is killed.
    holder = Inside(lab.sb, "flock", "--close", str(lab.state_dir / "state.lock"), "sleep", "600",
                    env={})
    started.append(holder)
    assert holder.child > 0
    # Shorter than the other faults: the candidate's own verdict waits for the lock within its
    # start timeout (deadline + soak + 10 s = 14 s).
    time.sleep(LOCK_SECONDS)
    _rollback_failed_meanwhile(lab)
    holder.kill()
    removed = time.monotonic()
    _converges_after(lab, removed, "the lock's holder", record_property)


# 4. The last-good's daemon cannot write once `recover` succeeded ---------------------------
def test_last_good_that_cannot_write_is_started_again_until_it_can(
        systemd_sandbox: SystemdSandbox, record_property: Any) -> None:
    """After `recover` succeeded, the last-good's daemon cannot take the writers' lock (a
    host drop-in makes it read-only to the agent unit): the agent unit fails and systemd
    restarts the last-good again and again (it has no start limit), each start trying again;
    once the drop-in is gone the node converges on the last-good with no agent-fsm command run
    by hand."""
    lab = _node(systemd_sandbox, private_state=False)
    last_good = lab.assets()
    _judging(lab)
    lock = lab.state_dir / "state.lock"
    lab.dropin(UNIT, "host-lock-read-only", f"[Service]\nReadOnlyPaths=-{lock}\n")

    def last_good_retried() -> bool:
        return (lab.sb.journal(RECOVERY_UNIT).count("rolling back to last-good 1.0.0") >= 1
                and lab.sb.journal(UNIT).count("could not open the writers' lock") >= 2)

    assert wait_until(last_good_retried, 60, interval=1), (
        "the last-good's daemon was not started again when it could not write" + lab.why())
    st = lab.status()
    assert (st["selected"], st["state"]) == ("1.0.0", "recovering"), lab.why()
    assert "could not open the writers' lock" in lab.sb.journal(UNIT), lab.why()
    (lab.sb.host_path(f"/etc/systemd/system/{UNIT}.d") / "host-lock-read-only.conf").unlink()
    lab.sb.systemctl("daemon-reload")
    removed = time.monotonic()
    _converges_after(lab, removed, "the read-only lock", record_property)
    assert lab.assets() == last_good
