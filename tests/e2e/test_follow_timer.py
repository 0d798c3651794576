"""The follow timer on a private systemd 252: installed with a `[channel]` config, the timer
is active and its follow runs by itself in the window, recorded in `status` (a channel nothing
serves: `failed`, nothing changed). No command is run by hand after install."""

from __future__ import annotations

import importlib.util
import shutil
import socket
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent_fsm.actions.channel import publishing
from agent_fsm_lab.lab import NAME, UNIT, Lab
from agent_fsm_lab.sandbox import SystemdSandbox

pytestmark = [pytest.mark.e2e]
if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark.append(pytest.mark.timeout(180))  # a safety net only: every wait is bounded

TIMER, SERVICE = f"{NAME}-follow.timer", f"{NAME}-follow.service"


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _root(directory: Path) -> Path:
    """A channel's first root, made with real keys, as the node is given it."""
    keys = directory / "keys"
    keys.mkdir()
    for name in ("root", "ci"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f",
                        str(keys / name)], check=True, timeout=30)
    publishing.init(directory / "stable", "stable", root_keys={"root": keys / "root"},
                    index_keys={"ci": keys / "ci"}, threshold=1,
                    now=datetime.now(UTC).replace(microsecond=0))
    return directory / "stable" / "root" / "1.json"


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs ssh-keygen")
def test_the_timer_runs_a_follow_by_itself_and_it_is_recorded(
        systemd_sandbox: SystemdSandbox) -> None:
    """Install with a window every 5 s and no spread: the timer is enabled and active, a
    follow runs from it within the bound, and `status --json` records it as failed with
    nothing changed, with the timer's next run; the node stays converged on 1.0.0. `doctor`
    says the timer is active, and says so when it is stopped."""
    lab = Lab(systemd_sandbox, deadline=3, soak=1)
    url = f"https://127.0.0.1:{_closed_port()}/stable"
    lab.config.write_text(lab.config.read_text() + "[channel]\n"
                          f'url = "{url}"\n'
                          f'root = "{_root(lab.dir)}"\n'
                          'window = "*:*:0/5"\n'
                          "spread_seconds = 0\n"
                          "timeout_seconds = 5\n")
    lab.pack("1.0.0")
    lab.install("1.0.0")
    sb = lab.sb
    assert (sb.show(TIMER, "ActiveState"), sb.show(TIMER, "UnitFileState")) == (
        "active", "enabled"), lab.why()
    assert sb.show(SERVICE, "SuccessExitStatus").split()[:2] == ["3", "4"]

    def followed() -> bool:
        return lab.status()["channel"]["outcome"] is not None

    sb.wait_for(followed, 40, "a follow started by the timer", units=(TIMER, SERVICE, UNIT))
    status = lab.status()
    channel = status["channel"]
    assert channel["url"] == url and channel["outcome"] == "failed", channel
    assert "nothing changed" in channel["message"], channel
    assert (status["state"], status["selected"], status["signal"]) == ("converged", "1.0.0",
                                                                        None)
    assert channel["timer"] == "active" and channel["next_run"] is not None, channel
    assert channel["next_run"] > channel["time"] - 1, channel
    assert channel["waiting"] == {"reason": "outside the window",
                                  "next_run": channel["next_run"], "eligible": []}, channel
    assert "follow timer active: outside the window: next at" in lab.cli("status").stdout
    doctor = lab.cli("doctor", check=False)
    assert f"{TIMER} active (*:*:0/5), next run" in doctor.stdout, doctor.stdout
    sb.systemctl("stop", TIMER)
    doctor = lab.cli("doctor", check=False)
    assert f"{TIMER} is inactive and enabled" in doctor.stdout, doctor.stdout
