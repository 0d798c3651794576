"""The workload is a service of its own, in a private systemd 252.

One node for the module: an agent whose release's workload is a shell script that writes what it
sees (its user, directory, arguments after placeholder expansion, environment, what it may
write) into a data directory the host config grants it (`[workload] writable_paths`), runs as
`nobody:nogroup` (`[workload] user`, `group`: accounts every Debian host has; no user is ever
created on the shared host), says a line on stdout, and then sleeps. Its health file is in that
data directory, so the candidate's judgment passes only if all that worked.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_fsm_lab import rootfs
from agent_fsm_lab.lab import NAME, UNIT, Lab
from agent_fsm_lab.sandbox import SystemdSandbox, missing_requirements, python_paths
from tests.e2e.conftest import NODES, require_sandbox

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("workload-node")]  # one module fixture
if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark.append(pytest.mark.timeout(150))  # a safety net only: every wait is bounded

NOBODY, NOGROUP = 65534, 65534
IDENTIFIER = "myagent"

# Braces a shell needs are written `{{`/`}}` (literal); `{release_dir}` and `{version}` are
# agent-fsm's placeholders, passed to the script as $0 and $1.
SCRIPT = """data=$2
{{
  echo "pwd=$(pwd)"
  echo "arg_release_dir=$0"
  echo "arg_version=$1"
  echo "uid=$(id -u)"
  echo "gid=$(id -g)"
  if test -r "$0/release.toml"; then echo release_readable=yes; else echo release_readable=no; fi
  for place in state:STATE other:OTHER etc:/etc granted:$data; do
    if touch "${{place#*:}}/probe" 2>/dev/null; then w=yes; else w=no; fi
    echo "writes_${{place%%:*}}=$w"
  done
}} > "$data/facts"
env > "$data/env"
echo "hello from the workload on stdout"
echo "$1" > "$data/health"
exec sleep infinity
"""


def _facts(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


@pytest.fixture(scope="module", params=NODES)
def node(request: pytest.FixtureRequest) -> Iterator[Lab]:
    """The node, upgraded from 1.0.0 to 2.0.0 (judged with its checks), its workload running as
    nobody: one sandbox of each node kind (systemd 252, and 257 on Debian 13) for all the tests
    of this module."""
    if request.param == "systemd252":
        require_sandbox()
        sandbox = SystemdSandbox(keep=python_paths())
    else:
        tree: rootfs.Node = request.getfixturevalue("debian13_node")
        require_sandbox(*missing_requirements(tree.rootfs), what="the Debian 13 node needs")
        sandbox = rootfs.sandbox(tree)
    try:
        sandbox.boot()
        lab = Lab(sandbox, deadline=5, soak=1, restart=3)
        data, other = lab.dir / "data", lab.dir / "other"
        for d in (data, other):  # both nobody's; only `data` is granted in the unit
            d.mkdir()
            os.chown(d, NOBODY, NOGROUP)
        text = lab.config.read_text()
        # The check reads the workload's health file and keeps the environment it was given.
        check = (f'env > {data}/check-env; test "$(cat {data}/health 2>/dev/null)" = '
                 '"$AGENT_FSM_VERSION"')
        text = text[:text.index("checks = ")] + f"checks = [[\"/bin/sh\", \"-c\", {json.dumps(check)}]]\n"
        text += ('[workload]\nuser = "nobody"\ngroup = "nogroup"\n'
                 f'identifier = "{IDENTIFIER}"\n'
                 f'writable_paths = ["{data}"]\n'
                 '[workload.environment]\nGREETING = "hello from the host"\n')
        lab.config.write_text(text)
        script = SCRIPT.replace("STATE", str(lab.state_dir)).replace("OTHER", str(other))
        workload = ("/bin/sh", "-c", script, "{release_dir}", "{version}", str(data))
        lab.pack("1.0.0", workload=workload)
        lab.install("1.0.0")
        # A candidate is judged with the same settings: its workload must be healthy as nobody.
        lab.pack("2.0.0", workload=workload)
        lab.cli("upgrade", "--to", "2.0.0", "--wait", "--timeout", "60", timeout=90)
        lab.settled()
        lab.data = data  # type: ignore[attr-defined]
        yield lab
    finally:
        sandbox.shutdown()


def test_workload_runs_as_its_user_in_its_directory_with_expanded_words(node: Lab) -> None:
    """The workload runs as nobody:nogroup, in its release's directory, with {release_dir} and
    {version} expanded to that directory and 2.0.0, and can read its own release."""
    facts = _facts(node.data / "facts")  # type: ignore[attr-defined]
    release_dir = f"/run/{NAME}/releases/2.0.0"
    assert (facts["uid"], facts["gid"]) == (str(NOBODY), str(NOGROUP)), facts
    assert (facts["pwd"], facts["arg_release_dir"], facts["arg_version"]) == (
        release_dir, release_dir, "2.0.0"), facts
    assert facts["release_readable"] == "yes", facts


def test_workload_writes_only_where_it_is_granted(node: Lab) -> None:
    """It writes the path `[workload] writable_paths` grants, and neither agent-fsm's state dir,
    nor /etc, nor a directory it owns that is not granted (the unit's ProtectSystem=strict)."""
    facts = _facts(node.data / "facts")  # type: ignore[attr-defined]
    assert {k: facts[k] for k in facts if k.startswith("writes_")} == {
        "writes_state": "no", "writes_other": "no", "writes_etc": "no", "writes_granted": "yes"}
    assert not (node.state_dir / "probe").exists()


def test_workload_and_checks_get_the_documented_environment(node: Lab) -> None:
    """The workload's environment is the documented one plus the host's [workload]
    environment, and neither it nor the checks get systemd's notify or watchdog variables."""
    env = _facts(node.data / "env")  # type: ignore[attr-defined]
    release_dir = f"/run/{NAME}/releases/2.0.0"
    assert {k: env.get(k) for k in ("PATH", "LANG", "HOME", "USER", "LOGNAME", "GREETING",
                                    "AGENT_FSM_VERSION", "AGENT_FSM_RELEASE_DIR",
                                    "AGENT_FSM_PAYLOAD_DIR")} == {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8", "HOME": "/nonexistent", "USER": "nobody", "LOGNAME": "nobody",
        "GREETING": "hello from the host", "AGENT_FSM_VERSION": "2.0.0",
        "AGENT_FSM_RELEASE_DIR": release_dir,
        "AGENT_FSM_PAYLOAD_DIR": f"{release_dir}/payload"}, env
    check_env = _facts(node.data / "check-env")  # type: ignore[attr-defined]
    for leaked in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        assert leaked not in env and leaked not in check_env, leaked
    assert check_env["AGENT_FSM_VERSION"] == "2.0.0"


def test_workload_output_carries_its_own_journal_identifier(node: Lab) -> None:
    """Its stdout reaches the journal under `[workload] identifier`, not agent-fsm's."""
    def said() -> str:
        node.sb.run("journalctl", "--sync", check=False)
        return node.sb.run("journalctl", "--no-pager", "-o", "cat", "-t", IDENTIFIER,
                           check=False).stdout

    end = time.monotonic() + 10
    while "hello from the workload on stdout" not in said() and time.monotonic() < end:
        time.sleep(0.2)
    assert "hello from the workload on stdout" in said(), node.sb.journal(UNIT, 40)
    ours = node.sb.run("journalctl", "--no-pager", "-o", "cat", "-t", "agent-fsm",
                       check=False).stdout
    assert "hello from the workload on stdout" not in ours.splitlines()  # (its command is)


def test_status_shows_the_workload_and_never_a_dead_one_running(node: Lab) -> None:
    """`status --json` shows the workload running with its pid; after `kill -9` of that pid no
    status says it runs until a new one has started and no StatusText says the killed one
    runs, and the new one is counted as a restart."""
    work = node.status()["workload"]
    assert work["running"] is True and work["user"] == "nobody", work
    old = work["pid"]
    assert node.sb.run("cat", f"/proc/{old}/status").stdout.count(f"\t{NOBODY}\t") >= 1
    assert "workload running" in node.sb.show(UNIT, "StatusText")
    node.sb.run("kill", "-9", str(old))
    seen_down, new = False, None
    end = time.monotonic() + 30
    while time.monotonic() < end:
        work = node.status()["workload"]
        if work["running"]:
            assert work["pid"] != old, work
            new = work
            if seen_down:
                break
        else:
            seen_down = True
            assert work["pid"] is None, work
            text = node.sb.show(UNIT, "StatusText")  # (a new daemon may have set its own since)
            assert f"workload running (pid {old})" not in text, text
        time.sleep(0.1)
    assert seen_down, "status never showed the killed workload as not running"
    assert new is not None, f"no new workload within 30s:\n{node.why()}"
    assert new["restarts"] >= 1, new
