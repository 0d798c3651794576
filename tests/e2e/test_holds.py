"""Holds and inhibitors under a real systemd 252: a workload's inhibitor refuses an upgrade until
it is lifted, and neither a hold nor an inhibitor stands in the way of a rollback."""

from __future__ import annotations

import pytest

from agent_fsm_lab.lab import RECOVERY_UNIT, UNIT, Lab, wait_until
from agent_fsm_lab.sandbox import SystemdSandbox

pytestmark = pytest.mark.e2e

INHIBITORS = "/run/agent-fsm-inhibitors"
# A workload as docs/operations.md shows it: take the inhibitor (written under a dot name, then
# moved into place) with its own PID, and do the work that must not be interrupted.
WORKLOAD = f"""#!/bin/sh
mkdir -p {INHIBITORS}
printf 'name=%s\\nreason=%s\\npid=%s\\n' nightly-backup 'copying the database' "$$" \\
    > {INHIBITORS}/.nightly-backup.tmp
mv {INHIBITORS}/.nightly-backup.tmp {INHIBITORS}/nightly-backup
exec sleep 600
"""


def _why(lab: Lab) -> str:
    return lab.sb.diagnostics(UNIT, RECOVERY_UNIT)


def test_an_inhibitor_refuses_until_lifted_and_nothing_holds_a_rollback(
        systemd_sandbox: SystemdSandbox) -> None:
    """A workload's inhibitor file refuses `upgrade` (exit 3, naming the workload, its PID and
    reason; shown in `status --json`) and once the workload removes it the same upgrade goes
    through. Then, with a hold and a live inhibitor in place, an upgrade forced past them
    (naming each) to a candidate that crashes at start is rolled back through the real units:
    recovery, the last-good's daemon and its gate never look at them, and both are still there
    after. (One sandbox for both halves: each boot costs seconds of the e2e budget.)"""
    lab = Lab(systemd_sandbox, max_attempts=1)  # a crash at start reaches recovery at once
    lab.pack("1.0.0")
    lab.install("1.0.0")
    lab.pack("2.0.0")
    script = lab.dir / "backup.sh"
    script.write_text(WORKLOAD)
    lab.sb.run("systemd-run", "--unit=backup", "--service-type=exec", "/bin/sh", str(script))
    taken = lab.sb.host_path(f"{INHIBITORS}/nightly-backup")
    assert wait_until(taken.exists, 10), lab.sb.diagnostics("backup.service")
    pid = int(lab.sb.show("backup.service", "MainPID"))

    refused = lab.cli("upgrade", "--to", "2.0.0", check=False)
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert f"nightly-backup (pid {pid}): 'copying the database'" in refused.stderr
    held = lab.status()
    [shown] = held["inhibitors"]
    assert (shown["name"], shown["pid"], shown["stale"]) == ("nightly-backup", pid, False)
    assert (held["selected"], held["signal"]) == ("1.0.0", None)

    lab.sb.run("rm", f"{INHIBITORS}/nightly-backup")  # the workload lifts it
    proc = lab.cli("upgrade", "--to", "2.0.0", "--wait", "--timeout", "60", check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr + _why(lab)
    assert "converged on 2.0.0" in proc.stdout
    lab.sb.systemctl("stop", "backup.service")

    # Held and inhibited: the way back does not care.
    last_good = lab.assets()
    lab.pack("3.0.0", "crash")
    lab.cli("hold", "--reason", "change freeze", "--until", "1d")
    lab.sb.run("/bin/sh", "-c", f"printf 'reason=pinned by pid 1\\npid=1\\n' > {INHIBITORS}/init")
    proc = lab.cli("upgrade", "--to", "3.0.0", "--force", "--wait", "--timeout", "90",
                   check=False)
    assert proc.returncode == 4, proc.stdout + proc.stderr + _why(lab)
    assert "--force: going past the hold" in proc.stdout
    assert "--force: going past the inhibitor init" in proc.stdout
    end = lab.settled()
    assert (end["selected"], end["last_good"]) == ("2.0.0", "2.0.0")
    assert end["last_result"]["outcome"] == "rolled_back"
    assert lab.assets() == last_good
    assert end["hold"]["reason"] == "change freeze" and not end["hold"]["expired"]
    assert [i["name"] for i in end["inhibitors"]] == ["init"]
