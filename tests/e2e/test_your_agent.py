"""docs/your-agent.md, end to end: every shell block of the guide runs, in order, in one private
systemd 252, with the guide's C agent built by gcc, and what the guide says happens does.

The blocks run as written but for what a shared host cannot take (each stand-in is named in the
guide's introduction): the node's paths (`/etc/agent-fsm`, `/var/lib/myagent`, and the config's
`state_dir`, `lib_dir` and `bin_link`, added to its config) go below the sandbox's test
directory; `scp FILE node:DIR` is `cp FILE DIR`; `useradd` is not run and the agent runs as
`nobody`; port 8080 is a free one. The default config file is named by `AGENT_FSM_CONFIG`.
Before the bootstrap, `agent-fsm` is this checkout's (the build machine's); after it, the
`bin_link` the bootstrap wrote comes first on PATH.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import agent_fsm
from agent_fsm_lab.lab import SERVICE_PATH
from agent_fsm_lab.sandbox import SystemdSandbox, python_paths
from tests.e2e.conftest import require_sandbox

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("your-agent-guide")]  # one module fixture
if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark.append(pytest.mark.timeout(300))  # a safety net: every block's run is bounded

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "your-agent.md"
UNIT, RECOVERY_UNIT = "myagent.service", "myagent-recovery.service"


def guide_blocks() -> list[str]:
    """The guide's shell blocks, in order."""
    return re.findall(r"^```sh\n(.*?)^```", GUIDE.read_text(), re.M | re.S)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Node:
    """The guide's build machine and node, one sandbox: where its paths go, how it runs."""

    def __init__(self, sb: SystemdSandbox) -> None:
        self.sb = sb
        self.dir = sb.test_dir
        self.port = free_port()
        self.link = self.dir / "bin" / "agent-fsm"
        self.config = self.dir / "etc" / "agent-fsm" / "config.toml"
        self.data = self.dir / "var" / "lib" / "myagent"
        work = self.dir / "work"
        work.mkdir()
        self.cwd_file = self.dir / ".cwd"
        self.cwd_file.write_text(f"{work}\n")
        devbin = self.dir / "devbin"  # the build machine's agent-fsm: this checkout's
        devbin.mkdir()
        (devbin / "agent-fsm").write_text(
            f"#!/bin/sh\nPYTHONPATH={Path(agent_fsm.__file__).resolve().parents[1]} "
            f'exec {sys.executable} -m agent_fsm "$@"\n')
        (devbin / "agent-fsm").chmod(0o755)
        self.env = {"PATH": f"{self.link.parent}:{devbin}:{SERVICE_PATH}",
                    "AGENT_FSM_CONFIG": str(self.config), "COLUMNS": "120",
                    "HOME": str(self.dir)}

    def substitute(self, block: str) -> str:
        """The block as this node runs it (the module docstring's stand-ins)."""
        d = self.dir
        text = "\n".join(line for line in block.splitlines() if not line.startswith("useradd "))
        text = re.sub(r"\bscp (\S+) node:(\S+)", r"cp \1 \2", text)
        text = text.replace("-o myagent -g myagent", "-o nobody -g nogroup")
        text = text.replace('user = "myagent"', 'user = "nobody"')
        text = text.replace('name = "myagent"\n', f'name = "myagent"\nstate_dir = "{d}/state"\n'
                            f'lib_dir = "{d}/lib"\nbin_link = "{self.link}"\n')
        text = text.replace("/etc/agent-fsm", f"{d}/etc/agent-fsm")
        text = text.replace("/var/lib/myagent", str(self.data))
        text = text.replace("8080", str(self.port))
        host = text.replace(str(d), "TESTDIR")
        for word in ("/etc/agent-fsm", "/var/lib/", "/usr/local", "useradd", "node:"):
            assert not re.search(rf"(?<![\w/]){re.escape(word)}", host), (
                f"the guide's block would reach the host ({word}):\n{block}")
        return text + "\n"

    def run(self, script: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """A block in a shell of its own, in the directory the last block left."""
        wrapped = (f'set -e\ncd "$(cat {self.cwd_file})"\n'
                   f"trap 'pwd > {self.cwd_file}' EXIT\n{script}")
        return self.sb.run("sh", "-c", wrapped, check=False, timeout=timeout, env=self.env)

    def status(self) -> dict[str, Any] | None:
        """`agent-fsm status --json` through the link on PATH, once there is one."""
        if not self.link.is_symlink():
            return None
        proc = self.sb.run(str(self.link), "status", "--json", check=False, env=self.env)
        if proc.returncode != 0:
            return {"error": proc.stderr}
        data: dict[str, Any] = json.loads(proc.stdout)
        return data

    def settled(self, timeout: float = 30) -> None:
        """Wait (bounded) until the agent is converged with its gate open."""
        def done() -> bool:
            s = self.status() or {}
            return s.get("state") == "converged" and s.get("gate") == "open"

        self.sb.wait_for(done, timeout, "the agent to open its gate", units=(UNIT, RECOVERY_UNIT))

    def healthz(self) -> tuple[int, str]:
        """What GET /healthz answers now (the sandbox shares the host's network)."""
        url = f"http://127.0.0.1:{self.port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError as exc:
            return 0, str(exc)

    def started(self) -> tuple[str, str] | None:
        path = self.data / "started"
        try:
            return path.read_text(), path.owner()
        except (OSError, KeyError):
            return None

    def why(self) -> str:
        return self.sb.diagnostics(UNIT, RECOVERY_UNIT)


@dataclass
class Step:
    block: str
    proc: subprocess.CompletedProcess[str]
    status: dict[str, Any] | None
    healthz: tuple[int, str]
    started: tuple[str, str] | None  # the agent's data file: (its text, its owner)
    seconds: float  # how long the block ran (shown when a test fails; never asserted)


@dataclass
class Walk:
    node: Node
    steps: list[Step] = field(default_factory=list)
    stopped: str = ""  # why the walk stopped before the guide's end

    def after(self, needle: str) -> Step:
        """The step of the block that contains `needle`; fails if the walk did not get there."""
        for step in self.steps:
            if needle in step.block:
                return step
        raise AssertionError(f"the walk never ran the block with {needle!r}: {self.stopped}")

    def output(self, step: Step) -> str:
        return (f"--- block\n{step.block}\n--- exit {step.proc.returncode}\n--- stdout\n"
                f"{step.proc.stdout}--- stderr\n{step.proc.stderr}")


def expected_exit(block: str) -> int:
    """4 for a block whose last command the guide says exits 4, else 0."""
    return 4 if re.search(r"# exit 4\b", block) else 0


@pytest.fixture(scope="module")
def walk() -> Iterator[Walk]:
    """The whole guide, once, in one booted sandbox."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is missing: the guide's agent is a C program built with gcc")
    require_sandbox()
    sb = SystemdSandbox(keep=python_paths())
    try:
        sb.boot()
        node = Node(sb)
        done = Walk(node)
        for block in guide_blocks():
            began = time.monotonic()
            proc = node.run(node.substitute(block))
            if "install --from" in block and proc.returncode == 0:
                node.settled()  # systemd starts the daemon, which opens the gate: a second or two
            done.steps.append(Step(block, proc, node.status(), node.healthz(), node.started(),
                                   time.monotonic() - began))
            if proc.returncode != expected_exit(block):
                done.stopped = done.output(done.steps[-1]) + "\n" + node.why()
                break
        yield done
    finally:
        sb.shutdown()


def converged_on(step: Step, version: str) -> bool:
    s = step.status or {}
    return (s.get("state") == "converged" and s.get("selected") == version
            and s.get("last_good") == version and s.get("gate") == "open"
            and s.get("signal") is None)


class TestTheGuide:
    def test_every_block_runs_as_the_guide_says(self, walk: Walk) -> None:
        """Each shell block of the guide exits 0, or 4 where the guide says so."""
        assert len(walk.steps) == len(guide_blocks()), walk.stopped
        assert len(walk.steps) >= 10

    def test_the_bootstrap(self, walk: Walk) -> None:
        """The release's own launcher installs 1.0.0 from an empty node: the agent answers 200,
        runs as the configured user and writes its data directory, and `agent-fsm` on PATH is
        the selected release's."""
        step = walk.after("install --from")
        assert converged_on(step, "1.0.0"), walk.output(step) + str(step.status)
        assert walk.node.link.is_symlink()
        assert step.healthz == (200, "ok 1.0.0\n"), step.healthz
        shown = walk.after("agent-fsm --version")
        assert "agent-fsm " in shown.proc.stdout and "(release 1.0.0)" in shown.proc.stdout
        assert "ok 1.0.0" in shown.proc.stdout  # curl
        assert step.started == ("1.0.0\n", "nobody"), step.started
        workload = (step.status or {}).get("workload") or {}
        assert workload.get("running") is True and workload.get("user") == "nobody", workload

    def test_a_judged_upgrade(self, walk: Walk) -> None:
        """`upgrade --to 1.1.0 --wait` exits 0, converged on 1.1.0, which answers."""
        step = walk.after("upgrade --to 1.1.0")
        assert step.proc.returncode == 0, walk.output(step)
        assert converged_on(step, "1.1.0"), step.status
        assert step.healthz == (200, "ok 1.1.0\n")
        assert "judged ok" in step.proc.stdout

    def test_a_crash_at_start_rolls_back(self, walk: Walk) -> None:
        """The build that exits at start is judged failed and rolled back to 1.1.0 (exit 4),
        and is known bad; the reason has its exit status and its line on stderr. `--wait`
        said each phase on a line, and its last line on stderr ends with that reason."""
        step = walk.after("upgrade --to 1.2.0")
        assert step.proc.returncode == 4, walk.output(step)
        assert converged_on(step, "1.1.0"), step.status
        status = step.status or {}
        assert status["last_result"]["to"] == "1.2.0"
        assert status["last_result"]["outcome"] == "rolled_back"
        reason = status["last_result"]["reason"]
        assert reason == ('the workload exited with status 1 while being judged; its last lines '
                          'on stderr: "myagent 1.2.0: cannot start: bad build"'), reason
        assert step.proc.stderr.strip().splitlines()[-1].endswith(f"crashed: {reason}")
        phases = [line.split("s ", 1)[1] for line in step.proc.stdout.splitlines()
                  if re.match(r"\d{4}-\d\d-\d\dT[\d:]{8}Z \+", line)]
        assert phases == ["candidate 1.2.0 starting", phases[1], "1.2.0 judged failed; rolling "
                          "back", "rolled back from 1.2.0"], step.proc.stdout
        assert phases[1].startswith("judging 1.2.0: attempt 1 of 2; deadline in "), phases
        assert "1.2.0" in [k["version"] for k in status["known_bad"]]
        assert step.healthz == (200, "ok 1.1.0\n")

    def test_a_503_rolls_back(self, walk: Walk) -> None:
        """The build that answers 503 fails its http check and is rolled back (exit 4)."""
        step = walk.after("upgrade --to 1.3.0")
        assert step.proc.returncode == 4, walk.output(step)
        assert converged_on(step, "1.1.0"), step.status
        result = (step.status or {})["last_result"]
        assert (result["to"], result["outcome"], result["reason_class"]) == (
            "1.3.0", "rolled_back", "check_failed"), result
        assert step.healthz == (200, "ok 1.1.0\n")

    def test_back_to_an_older_version(self, walk: Walk) -> None:
        """After convergence, an upgrade to the older 1.0.0 is judged and lands on it."""
        step = walk.after("upgrade --to 1.0.0")
        assert step.proc.returncode == 0, walk.output(step)
        assert converged_on(step, "1.0.0"), step.status
        assert step.healthz == (200, "ok 1.0.0\n")
        assert step.started == ("1.0.0\n", "nobody"), step.started

    def test_what_to_read(self, walk: Walk) -> None:
        """The commands of "what to read" show the rollback and the agent's own journal lines
        under its identifier; doctor finds nothing failing (it would exit 1)."""
        step = walk.after("agent-fsm doctor")
        assert step.proc.returncode == 0, walk.output(step)
        out = step.proc.stdout
        assert "recover" in out  # history --upgrade 1.2.0
        assert f"myagent 1.0.0 listening on 127.0.0.1:{walk.node.port}" in out  # journalctl -t
        assert "link on PATH" in out
        own = walk.node.sb.run("journalctl", "-t", "myagent", "-o", "cat", "--no-pager").stdout
        assert "listening on" in own and "judging candidate" not in own, own

    def test_try_takes_the_guides_releases_through_a_throwaway_node(self, walk: Walk) -> None:
        """`python -m agent_fsm_lab try` with the guide's own config and release archives (once
        the guide's node is stopped: they listen on the same port) judges 1.1.0 ok, rolls the
        crashing 1.2.0 back with its stderr line, proves the way back and leaves nothing."""
        node = walk.node
        assert len(walk.steps) == len(guide_blocks()), walk.stopped
        node.sb.systemctl("stop", "myagent.service")
        archives = {p.name: p for p in node.dir.rglob("myagent-1.*.tar.gz")}
        releases = [archives[f"myagent-{v}.tar.gz"] for v in ("1.0.0", "1.1.0", "1.2.0")]
        proc = subprocess.run([sys.executable, "-m", "agent_fsm_lab", "try", "--config",
                               str(node.config), *map(str, releases)], capture_output=True,
                              text=True, timeout=280, check=False,
                              cwd=Path(agent_fsm.__file__).resolve().parents[1],
                              env={"PATH": SERVICE_PATH, "COLUMNS": "200"})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        out = proc.stdout
        assert "added 1.0.0, 1.1.0, 1.2.0" in out and "installed 1.0.0" in out
        assert "upgrade --to 1.1.0 --wait: exit 0, judged ok" in out
        assert "upgrade --to 1.2.0 --wait: exit 4, the workload exited with status 1 while " \
            "being judged" in out and "cannot start: bad build" in out
        assert "way back: 1.0.0 killed at each of its 2 start(s): exit 4, rolled back, the " \
            "node back on 1.1.0" in out
        booted = Path(out.split(" in ", 1)[1].split()[0])
        assert booted.name.startswith("agent-fsm-e2e-") and not booted.exists()
