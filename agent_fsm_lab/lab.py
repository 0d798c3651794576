"""A node under a private systemd: what `agent-fsm demo` and the end-to-end tests drive.

`Lab` configures an agent named `agent` in a booted `SystemdSandbox`: its state and scripts in
the sandbox's test directory, its units in the sandbox's private unit directory, a health check
from the host's config. It packs releases of four kinds:

- good: its workload writes `<state_dir>/health` with its version, so the check passes;
- unhealthy: its workload never writes the health file, and it ships broken assets;
- crash: its binary exits 3 at start, and it ships broken assets;
- silent: its binary runs but never sends READY=1 (systemd's start timeout judges it).

Broken assets name a binary that does not exist and a recovery script that exits 1: had the
candidate's assets been written before its judgment, its own rollback would break.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

from agent_fsm.actions import packing

from .sandbox import SystemdSandbox, python_paths, under_private_tmp

Kind = Literal["good", "unhealthy", "crash", "silent"]
NAME = "agent"
UNIT = f"{NAME}.service"
RECOVERY_UNIT = f"{NAME}-recovery.service"

BROKEN_ASSETS = {
    "agent.service": "[Unit]\nDescription=broken candidate ${version}\n\n[Service]\n"
                     "ExecStart=/nonexistent/${name}-${version}\n",
    "recovery.service": "[Unit]\nDescription=broken recovery of ${version}\n\n[Service]\n"
                        "Type=oneshot\nExecStart=/bin/false\n",
    "recovery.sh": "#!/bin/sh\necho 'broken recovery script of ${version}' >&2\nexit 1\n",
}


class Lab:
    def __init__(self, sandbox: SystemdSandbox, *, deadline: float = 6, soak: float = 1,
                 max_attempts: int = 2) -> None:
        self.sb = sandbox
        self.dir = sandbox.test_dir
        self.state_dir = self.dir / "state"
        self.packs = self.dir / "packs"
        self.config = self.dir / "config.toml"
        health = self.state_dir / "health"
        check = f'test "$(cat {health} 2>/dev/null)" = "$AGENT_FSM_VERSION"'
        self.config.write_text(
            f'name = "{NAME}"\n'
            f'state_dir = "{self.state_dir}"\n'
            f'lib_dir = "{self.dir / "lib"}"\n'
            'unit_dir = "/etc/systemd/system"\n'
            f'run_dir = "/run/{NAME}"\n'
            "[judgment]\n"
            f"deadline_seconds = {deadline}\n"
            f"soak_seconds = {soak}\n"
            f"max_attempts = {max_attempts}\n"
            f"checks = [[\"/bin/sh\", \"-c\", {json.dumps(check)}]]\n"
        )

        if any(under_private_tmp(p) for p in python_paths()):
            # The Python running agent-fsm lives under /tmp (a checkout there): the unit's own
            # PrivateTmp= would hide it from the daemon. Only this lab relaxes it, by a drop-in.
            dropin = sandbox.host_path(f"/etc/systemd/system/{UNIT}.d")
            dropin.mkdir(parents=True, exist_ok=True)
            (dropin / "lab-python-under-tmp.conf").write_text("[Service]\nPrivateTmp=no\n")

    # Releases ---------------------------------------------------------------------------
    def pack(self, version: str, kind: Kind = "good") -> Path:
        """Pack a release of the given kind and add it to the node."""
        health = self.state_dir / "health"
        workload = ("/bin/sh", "-c", f'echo "$AGENT_FSM_VERSION" > {health}; exec sleep infinity')
        if kind == "unhealthy":
            workload = ("/bin/sh", "-c", "exec sleep infinity")
        path = packing.pack(version, self.packs / version, workload)
        if kind != "good":
            for name, text in BROKEN_ASSETS.items():
                (path / "assets" / name).write_text(text)
        launcher = path / "bin" / "agent-fsm"
        if kind == "crash":
            launcher.write_text("#!/bin/sh\necho 'candidate crashes at start' >&2\nexit 3\n")
        elif kind == "silent":
            launcher.write_text("#!/bin/sh\necho 'candidate never says READY=1' >&2\n"
                                "exec sleep infinity\n")
        self.cli("release", "add", str(path))
        return path

    # Driving ----------------------------------------------------------------------------
    def cli(self, *args: str, check: bool = True,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run agent-fsm inside the sandbox, as an operator on that host would."""
        return self.sb.run(sys.executable, "-m", "agent_fsm", "--config", str(self.config),
                           *args, check=check, timeout=timeout, env={"COLUMNS": "120"})

    def status(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.cli("status", "--json").stdout)
        return data

    def history(self) -> list[dict[str, Any]]:
        data: list[dict[str, Any]] = json.loads(self.cli("history", "--json",
                                                         "--limit", "1000").stdout)
        return data

    def asset(self, name: str) -> bytes:
        """An asset as it is on the node's disk (units live in the sandbox's private tmpfs)."""
        if name.endswith(".sh"):
            return (self.dir / "lib" / name).read_bytes()
        return self.sb.host_path(f"/etc/systemd/system/{name}").read_bytes()

    def assets(self) -> dict[str, bytes]:
        return {n: self.asset(n) for n in (UNIT, RECOVERY_UNIT, f"{NAME}-recovery.sh")}

    def settled(self, timeout: float = 60) -> dict[str, Any]:
        """Wait until the agent is active with the gate open and nothing pending."""
        last: dict[str, Any] = {}

        def done() -> bool:
            nonlocal last
            last = self.status()
            return (last["state"] == "converged" and last["gate"] == "open"
                    and last["signal"] is None and last["owed"] is None
                    and self.sb.show(UNIT, "ActiveState") == "active")

        self.sb.wait_for(done, timeout, "the agent to settle (active, gate open, no signal)",
                         units=(UNIT, RECOVERY_UNIT))
        return last

    def install(self, version: str) -> dict[str, Any]:
        self.cli("install", "--version", version)
        return self.settled()

    def main_pid(self) -> int:
        return int(self.sb.show(UNIT, "MainPID"))


def wait_until(predicate: Any, timeout: float, interval: float = 0.1) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return False
