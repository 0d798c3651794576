"""One artifact for the fleet: releases packed here, on this machine's CPython 3.11, are added,
installed, upgraded to and rolled back from on a Debian 13 node (systemd 257, CPython 3.13)
with that node's own python only, and their own CLI answers there."""

from __future__ import annotations

import json
import sys

import pytest

from agent_fsm.actions.releases import abi
from agent_fsm_lab.lab import NODE_PYTHON, RECOVERY_UNIT, UNIT, Lab
from agent_fsm_lab.sandbox import SystemdSandbox

pytestmark = pytest.mark.e2e


def test_a_release_packed_here_runs_its_whole_life_on_a_debian13_node(
        debian13: SystemdSandbox) -> None:
    """Packed on this host's 3.11, releases cover any CPython 3.11+; on the 3.13 node they are
    added, installed, upgraded to, rolled back from, and their own `status` and `history`
    answer with the node's python, without a traceback."""
    lab = Lab(debian13, soak=1)
    node_python = debian13.run(NODE_PYTHON, "-c", "import sys; print(sys.version_info[:2])")
    assert node_python.stdout.strip() == "(3, 13)" and sys.version_info[:2] != (3, 13)

    first = lab.pack("1.0.0")  # packed here, with this harness's 3.11; added on the node
    need = abi.read(first)
    assert need is not None and need.targets == (abi.ANY,) and not need.extensions
    lab.install("1.0.0")

    lab.pack("2.0.0")
    done = lab.cli("upgrade", "--to", "2.0.0", "--wait", "--timeout", "120", check=False)
    assert done.returncode == 0, done.stdout + done.stderr + debian13.diagnostics(UNIT)
    end = lab.settled()
    assert (end["selected"], end["last_good"]) == ("2.0.0", "2.0.0")

    lab.pack("3.0.0", "unhealthy")
    back = lab.cli("upgrade", "--to", "3.0.0", "--wait", "--timeout", "120", check=False)
    assert back.returncode == 4, back.stdout + back.stderr + debian13.diagnostics(
        UNIT, RECOVERY_UNIT)
    end = lab.settled()
    assert (end["selected"], end["last_good"]) == ("2.0.0", "2.0.0")
    assert end["last_result"]["outcome"] == "rolled_back"
    # The last-good's daemon, on the node's python (/usr/bin/python3 is its 3.13).
    argv = debian13.run("cat", f"/proc/{lab.main_pid()}/cmdline").stdout.split("\0")
    assert argv[0] == NODE_PYTHON and "daemon" in argv, argv

    launcher = lab.state_dir / "releases" / "2.0.0" / "bin" / "agent-fsm"
    for verb in (("status",), ("history",), ("status", "--json"), ("doctor",)):
        proc = debian13.run(str(launcher), "--config", str(lab.config), *verb, check=False)
        assert "Traceback" not in proc.stderr, proc.stderr
        assert proc.returncode == 0 or verb == ("doctor",), proc.stdout + proc.stderr
    status = json.loads(debian13.run(str(launcher), "--config", str(lab.config),
                                     "status", "--json").stdout)
    assert status["selected"] == "2.0.0" and status["state"] == "converged"
    history = debian13.run(str(launcher), "--config", str(lab.config), "history").stdout
    assert "begin_upgrade" in history and "3.0.0" in history


def test_a_wrong_python_in_the_config_does_not_stop_the_way_back(
        systemd_sandbox: SystemdSandbox) -> None:
    """The config's `python` made wrong (not there) while a candidate is judged: the last-good's
    launcher runs the python kept with its settings, so recovery and its daemon bring the node
    back on the last-good, and the journal says which python ran."""
    lab = Lab(systemd_sandbox, deadline=1, soak=0, max_attempts=1)
    lab.pack("1.0.0")
    lab.install("1.0.0")
    lab.pack("2.0.0", "silent")
    lab.cli("upgrade", "--to", "2.0.0", timeout=30)
    good = lab.config.read_text()
    assert f'python = "{NODE_PYTHON}"\n' in good
    lab.config.write_text(good.replace(f'python = "{NODE_PYTHON}"\n',
                                       'python = "/nonexistent/python3"\n'))
    end = lab.settled(timeout=60)
    assert (end["selected"], end["last_good"], end["signal"]) == ("1.0.0", "1.0.0", None), \
        _why(lab)
    assert end["last_result"]["outcome"] == "rolled_back"
    kept = f"running {NODE_PYTHON}, the `python` kept with the last-good's settings"
    assert kept in lab.sb.journal(RECOVERY_UNIT), _why(lab)
    lab.config.write_text(good)


def _why(lab: Lab) -> str:
    return lab.sb.diagnostics(UNIT, RECOVERY_UNIT)
