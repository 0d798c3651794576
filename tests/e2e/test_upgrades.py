"""Real upgrades, crashes and rollbacks through real units, in a private systemd 252; the core
(a good upgrade with the assets held while judged, a failing check, a crash at start, a SIGKILL
mid-judgment) on a Debian 13 node's systemd 257 too (`node_sandbox`)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from agent_fsm_lab.lab import RECOVERY_UNIT, UNIT, Lab, wait_until
from agent_fsm_lab.sandbox import SystemdSandbox

pytestmark = pytest.mark.e2e


@pytest.fixture
def lab(systemd_sandbox: SystemdSandbox) -> Iterator[Lab]:
    lab = Lab(systemd_sandbox)
    lab.pack("1.0.0")
    lab.install("1.0.0")
    yield lab


@pytest.fixture
def node_lab(node_sandbox: SystemdSandbox) -> Iterator[Lab]:
    """`lab` on each node kind (systemd252, systemd257), judged within 3 s as `installed`'s."""
    lab = Lab(node_sandbox, deadline=3)
    lab.pack("1.0.0")
    lab.install("1.0.0")
    yield lab


def _why(lab: Lab) -> str:
    return lab.sb.diagnostics(UNIT, RECOVERY_UNIT)


class TestGoodUpgrade:
    def test_assets_held_while_judged_then_written_then_gate(self, node_sandbox: SystemdSandbox) -> None:
        """A good upgrade: mid-judgment the assets on disk are the last-good's and the gate is
        shut; after, they are the candidate's, the gate is open and status says converged."""
        lab = Lab(node_sandbox, soak=4)
        lab.pack("1.0.0")
        lab.install("1.0.0")
        last_good = lab.assets()
        lab.pack("2.0.0")
        lab.cli("upgrade", "--to", "2.0.0")
        assert wait_until(lambda: (lab.status()["signal"] or {}).get("attempt") == 1, 30), _why(lab)
        mid = lab.status()
        assert mid["state"] == "candidate_running" and mid["gate"] == "closed"
        assert len(mid["held_assets"]) == 3
        assert lab.assets() == last_good
        refused = lab.cli("upgrade", "--to", "1.0.0", check=False)
        assert refused.returncode == 3 and "is being judged" in refused.stderr

        end = lab.settled()
        assert (end["selected"], end["last_good"]) == ("2.0.0", "2.0.0")
        assert end["last_result"]["outcome"] == "ok"
        after = lab.assets()
        assert after != last_good
        assert b"agent-fsm 2.0.0" in after[UNIT]
        trail = [(h["trigger"], h["to"]) for h in lab.history()][-4:]
        assert trail == [("begin_upgrade", "candidate_running"),
                         ("candidate_started", "candidate_running"),
                         ("judge_ok", "judged_ok"), ("complete", "converged")]

    def test_upgrade_wait_exits_0(self, lab: Lab) -> None:
        """`upgrade --wait` follows a good upgrade and exits 0 once converged."""
        lab.pack("2.0.0")
        proc = lab.cli("upgrade", "--to", "2.0.0", "--wait", "--timeout", "60", check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr + _why(lab)
        assert "converged on 2.0.0" in proc.stdout
        assert lab.sb.show(UNIT, "ActiveState") == "active"


class TestRollback:
    @pytest.mark.parametrize("kind", ["unhealthy", "crash", "exits"])
    def test_broken_candidate_rolls_back_through_held_assets(self, node_lab: Lab, kind: str) -> None:
        """A candidate with broken assets that fails its check, crashes at start, or whose
        workload exits while judged, rolls back through the last-good's held units and script:
        the node ends on the last-good with its assets byte for byte, the signal cleared, the
        gate open, the agent active. `upgrade --wait`, piped, says each phase on a timestamped
        line, and its last line on stderr ends with the reason `status` has."""
        lab = node_lab
        last_good = lab.assets()
        if kind == "exits":
            lab.pack("3.0.0", "unhealthy", workload=(
                "/bin/sh", "-c", "echo 'cannot start: bad build' >&2; exit 3"))
        else:
            lab.pack("3.0.0", kind)  # type: ignore[arg-type]
        proc = lab.cli("upgrade", "--to", "3.0.0", "--wait", "--timeout", "120", check=False)
        assert proc.returncode == 4, proc.stdout + proc.stderr + _why(lab)
        assert "rolled back to 1.0.0" in proc.stderr
        end = lab.settled()
        assert (end["selected"], end["last_good"]) == ("1.0.0", "1.0.0")
        assert end["last_result"]["outcome"] == "rolled_back"
        reason = end["last_result"]["reason"]
        assert proc.stderr.strip().splitlines()[-1].endswith(
            f"{end['last_result']['reason_class'].replace('_', ' ')}: {reason}"), proc.stderr
        phases = [m[1] for m in re.finditer(r"^\d{4}-\d\d-\d\dT[\d:]{8}Z \+ *[\d.]+s (.*)$",
                                            proc.stdout, re.M)]
        assert phases[0] == "candidate 3.0.0 starting", proc.stdout
        rolling = "rolling back from 3.0.0" if kind == "crash" else \
            "3.0.0 judged failed; rolling back"  # the recovery unit's `recover`, no verdict
        assert phases[-2:] == [rolling, "rolled back from 3.0.0"], phases
        if kind != "crash":  # a daemon that exits at start never counts its attempt
            assert any(p.startswith("judging 3.0.0: attempt 1 of ") for p in phases), phases
        if kind == "exits":
            assert reason == ('the workload exited with status 3 while being judged; its last '
                              'lines on stderr: "cannot start: bad build"'), reason
        assert lab.assets() == last_good
        assert lab.sb.show(RECOVERY_UNIT, "Result") == "success"
        # The held units are what systemd loaded: back on the last-good, it was not reloaded.
        assert "no daemon-reload" in lab.sb.journal(UNIT), _why(lab)

    def test_restart_seconds_paces_a_crashing_candidate(self, systemd_sandbox: SystemdSandbox) -> None:
        """With `restart_seconds = 0.2` the agent unit systemd loaded waits 200 ms before each
        restart, and a candidate crashing at start still reaches recovery at the start limit
        and rolls back."""
        lab = Lab(systemd_sandbox, restart=0.2)
        lab.pack("1.0.0")
        lab.install("1.0.0")
        assert lab.sb.show(UNIT, "RestartUSec") == "200ms"
        lab.pack("3.0.0", "crash")
        proc = lab.cli("upgrade", "--to", "3.0.0", "--wait", "--timeout", "120", check=False)
        assert proc.returncode == 4, proc.stdout + proc.stderr + _why(lab)
        end = lab.settled()
        assert (end["selected"], end["last_result"]["reason_class"]) == ("1.0.0", "crashed")
        assert lab.sb.show(UNIT, "RestartUSec") == "200ms"

    def test_candidate_that_never_sends_ready(self, node_sandbox: SystemdSandbox) -> None:
        """A candidate that never sends READY=1 is failed by systemd's start timeout and the
        node rolls back to the last-good; the result says the start timeout ended it (class
        deadline), not a crash."""
        # One attempt: each is a whole start timeout (12 s); the start after it is refused.
        lab = Lab(node_sandbox, deadline=2, soak=0, max_attempts=1)
        lab.pack("1.0.0")
        lab.install("1.0.0")
        last_good = lab.assets()
        lab.pack("4.0.0", "silent")
        proc = lab.cli("upgrade", "--to", "4.0.0", "--wait", "--timeout", "120", check=False)
        assert proc.returncode == 4, proc.stdout + proc.stderr + _why(lab)
        assert lab.assets() == last_good
        assert "timeout" in lab.sb.journal(UNIT)
        end = lab.settled()
        assert end["selected"] == "1.0.0"
        assert end["last_result"]["reason_class"] == "deadline", end["last_result"]
        assert ("did not finish starting within its start timeout (TimeoutStartSec=12s) in 1 "
                "attempt(s)") in end["last_result"]["reason"]


class TestResilience:
    def test_sigkill_mid_judgment_converges(self, node_sandbox: SystemdSandbox) -> None:
        """The candidate's daemon killed with SIGKILL in the middle of its judgment is restarted
        by systemd, judges again (attempt 2) and the node converges on the candidate."""
        lab = Lab(node_sandbox, soak=4, max_attempts=3)
        lab.pack("1.0.0")
        lab.install("1.0.0")
        lab.pack("2.0.0")
        lab.cli("upgrade", "--to", "2.0.0")
        assert wait_until(lambda: (lab.status()["signal"] or {}).get("attempt") == 1, 30), _why(lab)
        pid = lab.main_pid()
        lab.sb.run("kill", "-9", str(pid))
        end = lab.settled(timeout=90)
        assert end["selected"] == "2.0.0" and end["last_result"]["outcome"] == "ok"
        starts = [h for h in lab.history() if h["trigger"] == "candidate_started"]
        assert len(starts) == 2

    def test_plain_restarts_stop_cleanly_and_never_start_recovery(self, lab: Lab) -> None:
        """Restarting the agent is a clean stop (exit 0) even though its workload gets SIGTERM
        too: recovery never starts and the node stays settled."""
        for _ in range(5):
            lab.sb.systemctl("restart", UNIT)
            lab.settled()
        assert lab.sb.show(RECOVERY_UNIT, "ExecMainStartTimestampMonotonic") == "0", _why(lab)
        assert "exited with" not in lab.sb.journal(UNIT)

    def test_systemd_tells_when_a_unit_file_changed(self, lab: Lab) -> None:
        """Asked by agent-fsm, the real systemd says no reload is needed while both units are
        loaded as they are on disk, that one is once a unit file is newer than its copy, and
        that none is after a reload."""
        ask = ("import sys; from agent_fsm.system.systemd import Systemctl; "
               "print(Systemctl().reload_needed(sys.argv[1:]))")

        def needed() -> str:
            return lab.sb.run(lab.python, "-c", ask, UNIT, RECOVERY_UNIT,
                              env=lab.env).stdout.strip()

        assert needed() == "False"
        os.utime(lab.sb.host_path(f"/etc/systemd/system/{RECOVERY_UNIT}"))
        assert needed() == "True"
        lab.sb.systemctl("daemon-reload")
        assert needed() == "False"

    def test_many_upgrades_and_rollbacks_back_to_back(self, lab: Lab) -> None:
        """Upgrades and rollbacks back to back (start limit reset each time): each next upgrade
        still starts and ends where it should."""
        expected = "1.0.0"
        kinds = ["good", "good", "crash", "good", "good", "crash", "good"]
        # Packed meanwhile (seconds of CPU each, while the upgrades mostly wait on systemd);
        # each is added just before its upgrade, as before.
        with ThreadPoolExecutor(1) as packer:
            packs = [packer.submit(lab.pack, f"5.{i}.0", kind, add=False)  # type: ignore[arg-type]
                     for i, kind in enumerate(kinds)]
            for i, kind in enumerate(kinds):
                version = f"5.{i}.0"
                lab.cli("release", "add", str(packs[i].result(timeout=120)))
                proc = lab.cli("upgrade", "--to", version, "--wait", "--timeout", "120",
                               check=False)
                assert proc.returncode == (0 if kind == "good" else 4), proc.stderr + _why(lab)
                expected = version if kind == "good" else expected
                assert lab.settled()["selected"] == expected
