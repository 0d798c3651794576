"""What systemctl prints is read one way: the version the daemon renders the units for is the
one `doctor` names, and `status` reads `systemctl show` as the writers do."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_fsm.node.config import Config
from agent_fsm.system import unit_state
from agent_fsm.system.systemd import Systemctl
from agent_fsm.views.doctor.checks import doctor
from agent_fsm.wiring import open_node

# Prints `$VERSION_OUT` for --version; for show, one block per unit after `--`.
STUB = """#!/bin/sh
if [ "$1" = --version ]; then printf '%b' "$VERSION_OUT"; exit 0; fi
if [ "$1" = show ]; then
    while [ "$1" != -- ]; do shift; done; shift
    for u in "$@"; do
        printf 'Id=%s\\nLoadState=loaded\\nActiveState=failed\\nResult=exit-code\\n' "$u"
        printf 'NRestarts=2\\nExecMainStatus=3\\nNeedDaemonReload=no\\nDescription=a=b\\n'
        printf 'RestartUSec=\\n\\n'
    done
fi
"""


def _stub(tmp_path: Path) -> Path:
    stub = tmp_path / "systemctl"
    stub.write_text(STUB)
    stub.chmod(0o755)
    return stub


class TestOneReading:
    @pytest.mark.parametrize("printed", [
        "systemd 252 (252.38-1~deb12u1)\\n+PAM +AUDIT\\n", "systemd 257 (257.9-1~deb13u1)\\n",
        "systemd 245\\n", "systemd 256.7\\n", "systemd\\n", "",
    ])
    def test_doctor_names_the_version_the_daemon_renders_for(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, printed: str) -> None:
        """Whatever `systemctl --version` prints, doctor names the version the daemon's units
        are rendered for, or says it could not read one exactly when the daemon could not."""
        monkeypatch.setenv("VERSION_OUT", printed)
        node = open_node(Config(name="agent", systemctl=(str(_stub(tmp_path)),)),
                         tmp_path / "root")
        daemon = node.effectors.systemd_version()
        found = {f.check: f for f in doctor(node)}["systemd"]
        if daemon is None:
            assert found.detail.startswith("could not read the version")
        else:
            assert found.detail.startswith(f"systemd {daemon}")

    def test_status_reads_show_as_the_writers_do(self, tmp_path: Path) -> None:
        """`status`'s read of both units and a writer's read of one give the same properties,
        a value holding `=` and an empty one included."""
        prefix = (str(_stub(tmp_path)),)
        units = ["agent.service", "agent-recovery.service"]
        read = unit_state.show(prefix, units)
        systemctl = Systemctl(prefix)
        for unit in units:
            assert read[unit] == systemctl.show(unit, unit_state.PROPERTIES)
        assert read[units[1]]["Description"] == "a=b" and read[units[1]]["RestartUSec"] == ""
        assert systemctl.reload_needed(units) is False
