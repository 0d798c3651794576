"""Hooks at transitions through real units: a `before` hook refusing an upgrade, and a failing
`after` hook that cannot stop a rollback from converging."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_fsm_lab.lab import RECOVERY_UNIT, UNIT, Lab
from agent_fsm_lab.sandbox import SystemdSandbox

pytestmark = pytest.mark.e2e


def with_hooks(lab: Lab, when: str, **hooks: Path) -> None:
    """Add `[hooks.<when>]` to the lab's config (read afresh by every command and start)."""
    lines = "".join(f'{trigger} = ["{path}"]\n' for trigger, path in hooks.items())
    lab.config.write_text(lab.config.read_text() + f"[hooks.{when}]\n{lines}")


def hook(lab: Lab, name: str, body: str) -> Path:
    path = lab.dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


class TestHooks:
    def test_a_before_hook_refuses_and_a_failing_after_hook_cannot_stop_a_rollback(
            self, systemd_sandbox: SystemdSandbox) -> None:
        """A `before.begin_upgrade` hook that fails refuses `upgrade` with exit 3 and its last
        line, the node left as it was (state, versions, assets, running process); once it
        passes, a bad candidate rolls back and converges on the last-good although its
        `after.recover` and `after.recovered` hooks fail, which the daemon logs."""
        lab = Lab(systemd_sandbox, deadline=3)
        busy = lab.dir / "busy"
        drain = hook(lab, "drain.sh", f"echo 'draining agent'\nif [ -e {busy} ]; then\n"
                     "  echo 'drain refused: 2 jobs still running' >&2\n  exit 1\nfi\n")
        ran = lab.state_dir / "undrain-ran"
        undrain = hook(lab, "undrain.sh", f'echo "$AGENT_FSM_TRIGGER" >> {ran}\n'
                       "echo 'undrain failed: API unreachable' >&2\nexit 1\n")
        with_hooks(lab, "before", begin_upgrade=drain)
        with_hooks(lab, "after", recover=undrain, recovered=undrain)
        lab.pack("1.0.0")
        lab.install("1.0.0")
        lab.pack("3.0.0", "unhealthy")

        busy.touch()
        before, assets, pid = lab.status(), lab.assets(), lab.main_pid()
        refused = lab.cli("upgrade", "--to", "3.0.0", check=False)
        assert refused.returncode == 3, refused.stdout + refused.stderr
        assert refused.stderr.strip().splitlines() == [
            f"agent-fsm: begin_upgrade refused by its before hook: hook before.begin_upgrade "
            f"({drain}) exited 1: drain refused: 2 jobs still running"]
        after = lab.status()
        keys = ("state", "selected", "last_good", "signal", "gate", "last_result", "owed")
        assert {k: after[k] for k in keys} == {k: before[k] for k in keys}
        assert lab.assets() == assets and lab.main_pid() == pid
        assert after["hooks"][0] == {"when": "before", "trigger": "begin_upgrade",
                                     "argv": [str(drain)], "failed": None}
        assert f"before.begin_upgrade: {drain}" in lab.cli("status").stdout

        busy.unlink()
        proc = lab.cli("upgrade", "--to", "3.0.0", "--wait", "--timeout", "60", check=False)
        assert proc.returncode == 4, proc.stdout + proc.stderr
        end = lab.settled()
        assert (end["selected"], end["last_good"], end["state"]) == ("1.0.0", "1.0.0", "converged")
        assert end["last_result"]["outcome"] == "rolled_back"
        pid = lab.main_pid()

        def journal() -> str:
            return lab.sb.run("journalctl", "-u", UNIT, "--no-pager", "-o", "cat",
                              check=False).stdout

        lab.sb.wait_for(lambda: "hook after.recovered" in journal(), 15,
                        "after.recovered's failure in the journal", units=(UNIT, RECOVERY_UNIT))
        assert ran.read_text().split() == ["recover", "recovered"]
        assert "undrain failed: API unreachable (not fatal" in journal()
        # The daemon that converged goes on: nothing restarted it, nothing ran after recovered.
        assert lab.main_pid() == pid and lab.history()[-1]["trigger"] == "recovered"
        failed = {h["trigger"]: h["failed"] for h in lab.status()["hooks"] if h["failed"]}
        assert failed.keys() == {"recover", "recovered"}
        assert failed["recovered"]["error"].endswith("exited 1: undrain failed: API unreachable")
