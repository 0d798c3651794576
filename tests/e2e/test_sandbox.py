"""End-to-end checks of the sandbox itself: a real systemd drives real units, the host's 252 and
a Debian 13 node's 257 (`node_sandbox`)."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from agent_fsm_lab.sandbox import SystemdSandbox

NOTIFY_SCRIPT = """\
import os
import signal
import socket

address = os.environ["NOTIFY_SOCKET"]
if address.startswith("@"):
    address = "\\0" + address[1:]
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
    sock.connect(address)
    sock.sendall(b"STATUS=ready from the e2e script\\nREADY=1")
while True:
    signal.pause()
"""


@pytest.mark.e2e
def test_notify_service_becomes_active_after_ready(node_sandbox: SystemdSandbox) -> None:
    """A Type=notify service is active once its python3 script sends READY=1."""
    sb = node_sandbox
    script = sb.test_dir / "notify.py"
    script.write_text(NOTIFY_SCRIPT)
    sb.write_unit(
        "e2e-notify.service",
        f"""\
[Service]
Type=notify
ExecStart=/usr/bin/python3 {script}
TimeoutStartSec=10
""",
    )

    start = sb.systemctl("start", "e2e-notify.service", check=False)  # returns after READY=1

    assert start.returncode == 0, f"{start.stderr}\n{sb.diagnostics('e2e-notify.service')}"
    assert sb.show("e2e-notify.service", "ActiveState") == "active"
    assert sb.show("e2e-notify.service", "SubState") == "running"
    assert sb.show("e2e-notify.service", "StatusText") == "ready from the e2e script"


@pytest.mark.e2e
def test_failing_service_hits_start_limit_and_triggers_on_failure(
    node_sandbox: SystemdSandbox,
) -> None:
    """A service exiting 3 is restarted up to StartLimitBurst=2, ends failed, and OnFailure= ran."""
    sb = node_sandbox
    attempts = sb.test_dir / "attempts"
    marker = sb.test_dir / "on-failure.marker"
    sb.write_unit(
        "e2e-on-failure.service",
        f"""\
[Service]
Type=oneshot
ExecStart=/bin/sh -c 'echo "$MONITOR_UNIT $MONITOR_SERVICE_RESULT" > {marker}'
""",
        reload=False,
    )
    sb.write_unit(
        "e2e-fails.service",
        f"""\
[Unit]
StartLimitIntervalSec=60
StartLimitBurst=2
OnFailure=e2e-on-failure.service

[Service]
ExecStart=/bin/sh -c 'echo attempt >> {attempts}; exit 3'
Restart=on-failure
RestartSec=100ms
""",
    )
    units = ("e2e-fails.service", "e2e-on-failure.service")

    sb.systemctl("start", "e2e-fails.service", check=False)
    sb.wait_for(
        lambda: sb.show("e2e-fails.service", "ActiveState") == "failed" and marker.exists(),
        timeout=15,
        what="e2e-fails.service to fail and its OnFailure= unit to write its marker",
        units=units,
    )

    # systemd 252 keeps the last failure's result when the start limit refuses a restart.
    assert sb.show("e2e-fails.service", "Result") == "exit-code", sb.diagnostics(*units)
    assert sb.show("e2e-fails.service", "ExecMainStatus") == "3", sb.diagnostics(*units)
    assert attempts.read_text().splitlines() == ["attempt", "attempt"], sb.diagnostics(*units)
    assert "Start request repeated too quickly" in sb.journal("e2e-fails.service")
    assert marker.read_text().split() == ["e2e-fails.service", "exit-code"]


@pytest.mark.e2e
def test_sigkilled_main_process_is_restarted(node_sandbox: SystemdSandbox) -> None:
    """SIGKILL of a Restart=on-failure service's main process, sent from the host, restarts it."""
    sb = node_sandbox
    sb.write_unit(
        "e2e-sleeper.service",
        """\
[Service]
ExecStart=/bin/sleep infinity
Restart=on-failure
RestartSec=100ms
""",
    )
    sb.systemctl("start", "e2e-sleeper.service")
    first = int(sb.show("e2e-sleeper.service", "MainPID"))
    assert first > 0, sb.diagnostics("e2e-sleeper.service")
    host_pid = sb.host_pid(first)

    # `systemctl start` of a Type=simple unit returns once systemd has forked: until the child
    # execs, its command line is systemd's "(sleep)" placeholder (seen on 257).
    def execed() -> bool:
        cmdline = Path(f"/proc/{host_pid}/cmdline").read_bytes().split(b"\0")
        return cmdline[:2] == [b"/bin/sleep", b"infinity"]

    sb.wait_for(execed, timeout=10, what="e2e-sleeper.service's main process to exec /bin/sleep",
                units=["e2e-sleeper.service"])  # fmt: skip

    os.kill(host_pid, signal.SIGKILL)

    def restarted() -> bool:
        main_pid = int(sb.show("e2e-sleeper.service", "MainPID"))
        state = sb.show("e2e-sleeper.service", "ActiveState")
        return main_pid not in (0, first) and state == "active"

    sb.wait_for(restarted, timeout=10, what="e2e-sleeper.service to be restarted",
                units=["e2e-sleeper.service"])  # fmt: skip
    assert sb.show("e2e-sleeper.service", "NRestarts") == "1"
    assert not Path(f"/proc/{host_pid}").exists()


@pytest.mark.e2e
def test_host_tmp_is_untouched(unbooted_node_sandbox: SystemdSandbox) -> None:
    """Booting and shutting down the sandbox leaves the host's /tmp as it was."""
    host_dir = Path(tempfile.mkdtemp(prefix="agent-fsm-e2e-"))
    try:
        marker = host_dir / "marker"
        marker.write_text("host /tmp marker\n")
        sb = unbooted_node_sandbox
        sb.boot()

        assert sb.run("test", "-e", str(marker), check=False).returncode == 1, (
            "the sandbox's /tmp should be its own, without the host's files"
        )
        inside = f"/tmp/{sb.name}-inside"
        sb.run("sh", "-c", f"echo inside > {inside}")
        assert sb.host_path(inside).read_text() == "inside\n"
        assert not Path(inside).exists()
        sb.shutdown()

        assert marker.read_text() == "host /tmp marker\n"
        assert not Path(inside).exists()
        assert not sb.test_dir.exists()
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)
