"""A fleet of private-systemd nodes driven by a real Ansible: what the fleet e2e test rolls out to.

`Fleet` boots several `SystemdSandbox` nodes, each with a `Lab` of its own (config, state,
units), packs releases once on the host for all of them, writes an inventory that reaches every
node through Ansible's ``community.docker.nsenter`` connection (its PID 1 as the host sees it),
and runs ``ansible-playbook`` with the repository's collection (``ansible/``)::

    with Fleet(4) as fleet:
        src = fleet.pack("1.0.0")
        run = fleet.playbook("agent_fsm.fleet.rollout", version="1.0.0", src=src)
        assert run.returncode == 0, run.output

A good release's workload writes ``<test_dir>/health.d/health`` with its version (found from the
release directory it is given), which the nodes' health check reads; `Fleet.unhealthy` makes one
node's check fail whatever the release, as a node-specific fault would.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from agent_fsm.actions.releases import packing

from .lab import GOOD_WORKLOAD, Lab, cached
from .sandbox import DEFAULT_BASE_DIR, SystemdSandbox, python_paths

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[1]
COLLECTIONS = REPO / "ansible"


_RECAP = re.compile(r"^(?P<host>\S+)\s+:\s+(?P<counts>(?:\w+=\d+\s*)+)$", re.MULTILINE)


def ansible_playbook() -> Path | None:
    """The ansible-playbook next to this Python (the venv's), if Ansible is installed there."""
    path = Path(sys.executable).parent / "ansible-playbook"
    return path if path.exists() else None


@dataclass(frozen=True)
class PlaybookRun:
    returncode: int
    output: str
    seconds: float

    def recap(self) -> dict[str, dict[str, int]]:
        """PLAY RECAP: each host's counts (ok, changed, unreachable, failed, ...)."""
        recap = self.output.rsplit("PLAY RECAP", 1)[-1] if "PLAY RECAP" in self.output else ""
        return {m["host"]: {k: int(v) for k, v in (kv.split("=") for kv in m["counts"].split())}
                for m in _RECAP.finditer(recap)}


class Fleet:
    """`size` nodes named n1, n2, ...; boot with `boot` (or `with`), always `shutdown`."""

    def __init__(self, size: int, *, deadline: float = 3, soak: float = 0.5, max_attempts: int = 1) -> None:
        self.dir = DEFAULT_BASE_DIR / f"fleet-{uuid.uuid4().hex[:12]}"
        self.names = [f"n{i}" for i in range(1, size + 1)]
        self.judgment = {"deadline": deadline, "soak": soak, "max_attempts": max_attempts}
        self.sandboxes: dict[str, SystemdSandbox] = {}
        self.labs: dict[str, Lab] = {}
        self.inventory = self.dir / "inventory.ini"

    def __enter__(self) -> Fleet:
        self.boot()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.shutdown()

    def boot(self) -> None:
        """Boot every node and configure its agent; on failure, shut down what was booted."""
        try:
            self.dir.mkdir(parents=True, mode=0o755)
            for name in self.names:
                sandbox = SystemdSandbox(keep=python_paths())
                self.sandboxes[name] = sandbox
                sandbox.boot()
                lab = Lab(sandbox, deadline=self.judgment["deadline"], soak=self.judgment["soak"],
                          max_attempts=int(self.judgment["max_attempts"]))
                self._with_fault_check(lab)
                self.labs[name] = lab
            self._write_inventory()
        except BaseException:
            self.shutdown()
            raise

    def shutdown(self) -> None:
        """Shut every node down (each one even if another fails) and remove the fleet's files."""
        def stop(sandbox: SystemdSandbox) -> None:
            with contextlib.suppress(Exception):
                sandbox.shutdown()

        try:
            # In parallel: each poweroff waits for the node's units to stop.
            with ThreadPoolExecutor(max(1, len(self.sandboxes))) as pool:
                list(pool.map(stop, self.sandboxes.values()))
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
            with contextlib.suppress(OSError):
                DEFAULT_BASE_DIR.rmdir()  # only once no sandbox uses it

    # Nodes -------------------------------------------------------------------------------
    @staticmethod
    def _with_fault_check(lab: Lab) -> None:
        """The node's health check also fails while `<test_dir>/unhealthy` exists."""
        flag = lab.dir / "unhealthy"
        check = (f'test ! -e {flag} && '
                 f'test "$(cat {lab.health} 2>/dev/null)" = "$AGENT_FSM_VERSION"')
        line = f'checks = [["/bin/sh", "-c", {json.dumps(check)}]]'
        text, count = re.subn(r"^checks = .*$", lambda _: line, lab.config.read_text(), flags=re.MULTILINE)
        if count != 1:
            raise RuntimeError(f"{lab.config}: expected one `checks = ...` line, found {count}")
        lab.config.write_text(text)

    def unhealthy(self, name: str, on: bool = True) -> None:
        """Make node `name`'s health check fail (or pass again), whatever release it judges."""
        flag = self.labs[name].dir / "unhealthy"
        if on:
            flag.write_text("on\n")
        else:
            flag.unlink(missing_ok=True)

    def each(self, read: Callable[[Lab], T]) -> dict[str, T]:
        """`read(lab)` of every node, the nodes read in parallel."""
        with ThreadPoolExecutor(len(self.labs)) as pool:
            return dict(zip(self.labs, pool.map(read, self.labs.values()), strict=True))

    def status(self) -> dict[str, dict[str, Any]]:
        """Every node's `status --json`."""
        return self.each(Lab.status)

    def _write_inventory(self) -> None:
        lines = ["[nodes]"]
        for name in self.names:
            lines.append(f"{name} ansible_nsenter_pid={self.sandboxes[name].pid} "
                         f"agent_fsm_config={self.labs[name].config}")
        lines += ["", "[nodes:vars]", "ansible_connection=community.docker.nsenter",
                  "ansible_python_interpreter=/usr/bin/python3",
                  # The node's private /tmp: nothing Ansible copies lands on the host's disk.
                  "ansible_remote_tmp=/tmp/.ansible-remote", ""]
        self.inventory.write_text("\n".join(lines))

    # Releases and Ansible ----------------------------------------------------------------
    def pack(self, version: str) -> Path:
        """A good release of `version`, packed once on the host (the controller) for every node."""
        path = self.dir / "packs" / version
        cached(["release", version, "good", list(GOOD_WORKLOAD)], path,
               lambda at: packing.pack(version, at, GOOD_WORKLOAD))  # as a Lab packs it
        return path

    def playbook(self, playbook: str, *args: str, timeout: float = 240,
                 env: dict[str, str] | None = None, **extra_vars: Any) -> PlaybookRun:
        """Run ansible-playbook against the fleet with the repository's collection."""
        binary = ansible_playbook()
        if binary is None:
            raise RuntimeError(f"ansible-playbook is not installed next to {sys.executable}: "
                               "pip install -e '.[test]'")
        home = self.dir / "ansible-home"
        env = {
            **(env or {}),
            "PATH": f"{binary.parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8",
            "HOME": str(home),
            "ANSIBLE_HOME": str(home),
            "ANSIBLE_LOCAL_TEMP": str(home / "tmp"),
            "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_RETRY_FILES_ENABLED": "0",
            "ANSIBLE_HOST_KEY_CHECKING": "0",
            "ANSIBLE_DEPRECATION_WARNINGS": "0",
        }
        argv = [str(binary), "-i", str(self.inventory), playbook, *args,
                "-e", json.dumps(extra_vars)]
        start = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout,
                              cwd=self.dir, check=False)
        return PlaybookRun(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start)
