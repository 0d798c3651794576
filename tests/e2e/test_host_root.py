"""agent-fsm in a "container" drives its host: installs, upgrades and rolls back a private-systemd
node through `--root`, with units and script that name the node's own paths only.

The container is a child mount namespace of the node (as docs/containers.md runs agent-fsm under
podman): the node's `/` bind-mounted recursively at `HostRootLab.mount`, an empty tmpfs over its
own `/etc/systemd/system` and `/run`, the node's `/run/systemd` bind-mounted back (the socket
`systemctl` talks to), and no capability beyond podman's default set for a root container (less
SYS_CHROOT): nothing reaches the node except through the host root and that socket.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_fsm_lab.lab import NAME, RECOVERY_UNIT, UNIT, Lab
from agent_fsm_lab.sandbox import SystemdSandbox

pytestmark = pytest.mark.e2e

# podman's default capabilities for a rootful container (containers.conf `default_capabilities`,
# Debian's 4.3 adds SYS_CHROOT, which agent-fsm does not need).
PODMAN_CAPS = ("chown", "dac_override", "fowner", "fsetid", "kill", "net_bind_service",
               "setfcap", "setgid", "setpcap", "setuid")

# $1: the mount point of the node's root; then the command. Run inside the node (sb.run).
CONTAINER = """
set -eu
host=$1; shift
mount --make-rprivate /
mkdir -p "$host"
mount --rbind / "$host"
mount -t tmpfs -o mode=0755 tmpfs /etc/systemd/system
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir /run/systemd
mount --rbind "$host/run/systemd" /run/systemd
export AGENT_FSM_LAB_IN_CONTAINER=1
exec setpriv --bounding-set -all,{caps} --inh-caps -all -- "$@"
""".format(caps=",".join(f"+{c}" for c in PODMAN_CAPS))

# The config's `systemctl`: the real one, but `reset-failed` is refused in
# the container (as a policy that lets a container start units but not reset them would).
SYSTEMCTL_WRAPPER = """
if [ -n "${AGENT_FSM_LAB_IN_CONTAINER:-}" ] && [ "${1:-}" = reset-failed ]; then
    echo "Failed to reset failed state of $*: Access denied (refused in the container)" >&2
    exit 1
fi
exec systemctl "$@"
"""


class HostRootLab(Lab):
    """A `Lab` whose every `cli` call runs in a new container, with `--root` its mount point and
    `--config` the node's config file seen below it."""

    def __init__(self, sandbox: SystemdSandbox, **kwargs: Any) -> None:
        self.mount = sandbox.test_dir / "container" / "host"  # set before Lab's own cli calls
        super().__init__(sandbox, **kwargs)

    def container(self, *argv: str, check: bool = True, timeout: float = 60,
                  env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run `argv` in a new container on the node."""
        return self.sb.run("unshare", "--mount", "sh", "-c", CONTAINER, "sh", str(self.mount),
                           *argv, check=check, timeout=timeout, env=env)

    def cli(self, *args: str, check: bool = True, timeout: float = 300,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """agent-fsm in the container, as an operator there runs it."""
        return self.container(sys.executable, "-m", "agent_fsm", "--root", str(self.mount),
                              "--config", f"{self.mount}{self.config}", *args, check=check,
                              timeout=timeout, env={**self.env, **(env or {})})

    def node_status(self) -> dict[str, Any]:
        """`status --json` run on the node itself, with the config the units name."""
        data: dict[str, Any] = json.loads(super().cli("status", "--json").stdout)
        return data

    def written(self) -> dict[str, bytes]:
        """Every file agent-fsm wrote on the node but the release trees: the assets, the state
        file, the kept last-good assets, results, the signal."""
        out = {f"asset {n}": b for n, b in self.assets().items()}
        for path in self.state_dir.rglob("*"):
            if path.is_file() and "releases" not in path.relative_to(self.state_dir).parts:
                out[str(path)] = path.read_bytes()
        return out

    def assert_host_paths_only(self) -> None:
        """No file written on the node names the mount point; the units name the node's config
        and its selected/last-good binaries; the pointers are relative."""
        for what, data in self.written().items():
            assert str(self.mount).encode() not in data, f"{what} names the mount point"
        unit = self.asset(UNIT).decode()
        assert (f"ExecStart={self.state_dir}/selected/bin/agent-fsm --config {self.config} daemon"
                in unit), unit
        script = self.asset(f"{NAME}-recovery.sh").decode()
        assert f"exec {self.state_dir}/last-good/bin/agent-fsm --config {self.config} recover" \
            in script, script
        for link in ("selected", "last-good"):
            assert not os.readlink(self.state_dir / link).startswith("/")


@pytest.fixture
def lab(systemd_sandbox: SystemdSandbox) -> Iterator[HostRootLab]:
    wrapper = systemd_sandbox.test_dir / "systemctl-wrapper"
    wrapper.write_text(SYSTEMCTL_WRAPPER)
    yield HostRootLab(systemd_sandbox, config_extra={"systemctl": ["/bin/sh", str(wrapper)]})


def _why(lab: HostRootLab) -> str:
    return lab.sb.diagnostics(UNIT, RECOVERY_UNIT)


class TestHostRoot:
    def test_container_reaches_the_node_only_through_the_host_root(self, lab: HostRootLab) -> None:
        """A unit written into the container's own unit directory is not seen by the node; one
        written below the mount point is, and `systemctl` in the container starts it there."""
        probe = "[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/true\n"
        lab.container("sh", "-c", f"printf '{probe}' > /etc/systemd/system/own.service && "
                      f"printf '{probe}' > {lab.mount}/etc/systemd/system/probe.service && "
                      "systemctl daemon-reload && systemctl start probe.service && "
                      "! systemctl start own.service 2>/dev/null")
        assert lab.sb.show("own.service", "LoadState") == "not-found"
        assert lab.sb.show("probe.service", "ActiveState") == "active"
        assert not lab.sb.host_path("/etc/systemd/system/own.service").exists()

    def test_installs_upgrades_and_rolls_back_the_node(self, lab: HostRootLab) -> None:
        """From the container, agent-fsm adds releases into the node's state dir, installs 1.0.0,
        upgrades to a good 2.0.0 and rolls a crashing 3.0.0 back: the node's own systemd runs the
        units and the recovery script, which name the node's paths only. The config's
        `systemctl` refuses `reset-failed` in the container: each upgrade records
        reset_start_limit as skipped, goes on, and status and doctor say so."""
        lab.pack("1.0.0")
        binary = lab.state_dir / "releases" / "1.0.0" / "bin" / "agent-fsm"
        assert binary.is_file() and os.access(binary, os.X_OK)  # the node's own copy
        lab.install("1.0.0")
        lab.assert_host_paths_only()
        assert lab.sb.host_path(f"/run/{NAME}/gate").exists()  # the node's /run, not ours
        assert lab.sb.show(UNIT, "FragmentPath") == f"/etc/systemd/system/{UNIT}"
        assert lab.sb.run("systemctl", "is-enabled", UNIT).stdout.strip() == "enabled"

        lab.pack("2.0.0")
        done = lab.cli("upgrade", "--to", "2.0.0", "--wait", "--timeout", "60", check=False)
        assert done.returncode == 0, done.stdout + done.stderr + _why(lab)
        assert "reset_start_limit failed during begin_upgrade and was skipped" in done.stderr
        lab.assert_host_paths_only()
        node = lab.node_status()
        assert (node["selected"], node["last_good"], node["gate"]) == ("2.0.0", "2.0.0", "open")
        assert [(s["effect"], s["trigger"]) for s in node["skipped"]] == [
            ("reset_start_limit", "begin_upgrade")]
        assert "Access denied (refused in the container)" in node["skipped"][0]["error"]
        assert f"systemctl reset-failed {UNIT}" in lab.cli("doctor", check=False).stdout
        pid = lab.sb.host_pid(lab.main_pid())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert str(lab.config).encode() in argv and str(lab.mount).encode() not in b" ".join(argv)

        lab.pack("3.0.0", "crash")
        done = lab.cli("upgrade", "--to", "3.0.0", "--wait", "--timeout", "60", check=False)
        assert done.returncode == 4, done.stdout + done.stderr + _why(lab)
        end = lab.settled()
        assert (end["selected"], end["last_good"]) == ("2.0.0", "2.0.0")
        assert end["last_result"]["outcome"] == "rolled_back"
        assert lab.sb.show(RECOVERY_UNIT, "Result") == "success"  # the node ran the script
        assert lab.sb.show(RECOVERY_UNIT, "ExecMainStartTimestampMonotonic") != "0"
        lab.assert_host_paths_only()
        assert lab.node_status()["state"] == "converged"
