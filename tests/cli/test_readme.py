"""The README's commands run as shown, and the docs name what the commands print.

Every command line of the README's Commands section runs, in order, against a temporary
`--root`, with the config the section writes (its `cat > /etc/agent-fsm/config.toml` heredoc).
Two things are stood in for, as the other tests do at the process boundary: `systemctl` (a
script on PATH that records its calls) and the agent's daemon, whose transitions at start (the
ones `agent-fsm daemon` fires under systemd) the test fires itself; and the agent's build that
`--payload` names is a script. A release's own launcher (`DIR/bin/agent-fsm`, the bootstrap)
runs as it is, with `--root` added.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_fsm.node import config as config_mod
from agent_fsm.testing import FakeSystemd
from agent_fsm.wiring import Node, open_node
from tests.cli.test_cli import command_paths
from tests.views.test_history import ENTRY_KEYS
from tests.views.test_metrics import FAMILIES, types

pytestmark = pytest.mark.xdist_group("readme-run")  # its module fixture is made once (Makefile)

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
OPERATIONS = (ROOT / "docs" / "operations.md").read_text()

# Commands the README may show that cannot run here: they need root and a real systemd.
# The e2e suite runs them (`make test`, `tests/e2e/`).
NEEDS_SYSTEMD = {"demo", "daemon"}
# What `metrics` adds when the selected release declares a workload.
WORKLOAD_FAMILIES = {"agent_fsm_workload_running": "gauge", "agent_fsm_workload_restarts": "counter"}
FAKE_SYSTEMCTL = """#!/bin/sh
echo "$@" >> "${0}.calls"
"""


def section(title: str) -> str:
    """The README's `## title` section, up to the next `## `."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.M | re.S)
    assert match, f"README has no section {title!r}"
    return match.group(1)


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.M | re.S)


def is_agent_fsm(word: str) -> bool:
    """`agent-fsm` on PATH, or a release's own launcher (`DIR/bin/agent-fsm`)."""
    return word == "agent-fsm" or word.endswith("/bin/agent-fsm")


def command_lines() -> list[str]:
    """The agent-fsm command lines of the Commands section's shell blocks, in order."""
    lines = []
    for block in blocks(section("Commands"), "sh"):
        lines += [line.strip() for line in block.splitlines()
                  if line.strip() and is_agent_fsm(shlex.split(line, comments=True)[0])]
    return lines


def command_of(line: str) -> str:
    """The command a line runs, past the global options."""
    words = shlex.split(line, comments=True)[1:]
    while words and words[0] in ("--config", "--root"):
        words = words[2:]
    return words[0]


def written_config() -> str:
    """The config the Commands section writes (its heredoc to /etc/agent-fsm/config.toml)."""
    found = re.search(r"^cat > /etc/agent-fsm/config\.toml <<'EOF'\n(.*?)^EOF$",
                      section("Commands"), re.M | re.S)
    assert found, "the README's first install writes no /etc/agent-fsm/config.toml"
    return found.group(1)


def payloads() -> list[str]:
    """The directories the section's `--payload` options name."""
    return re.findall(r"--payload (\S+)", section("Commands"))


class Host:
    """A temporary host: config, --root, a fake systemctl, and the daemon's part played here."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.root = tmp / "root"
        # The host below the root has its python (release add asks it what it can load).
        (self.root / "usr" / "bin").mkdir(parents=True)
        (self.root / "usr" / "bin" / "python3").symlink_to("/usr/bin/python3")
        self.config = Path(self.place("/etc/agent-fsm/config.toml"))
        self.config.parent.mkdir(parents=True)
        self.config.write_text(written_config())
        for build in payloads():  # the agent's build: a script that would serve /healthz
            agent = tmp / build / "myagent"
            agent.parent.mkdir(parents=True, exist_ok=True)
            agent.write_text("#!/bin/sh\nexec sleep infinity\n")
            agent.chmod(0o755)
        self.made = tmp / "made"
        self.made.mkdir(mode=0o700)
        self.bin = tmp / "bin"
        self.bin.mkdir()
        (self.bin / "systemctl").write_text(FAKE_SYSTEMCTL)
        (self.bin / "systemctl").chmod(0o755)
        self.env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS")}
        self.env.update({"AGENT_FSM_CONFIG": str(self.config), "COLUMNS": "200",
                         "PATH": f"{self.bin}:{os.environ.get('PATH', '')}"})

    @property
    def systemctl_calls(self) -> list[str]:
        calls = self.bin / "systemctl.calls"
        return calls.read_text().splitlines() if calls.exists() else []

    def node(self) -> Node:
        return open_node(config_mod.load(self.config), self.root, systemd=FakeSystemd())

    def place(self, word: str) -> str:
        """An absolute path in the README names the host; here it goes below the temp dir.
        `$d`, the README's `mktemp -d`, is a directory only root can write, as that one."""
        if word.startswith("$d/"):
            return str(self.made / word.removeprefix("$d/"))
        return str(self.tmp / "host" / word.lstrip("/")) if word.startswith("/") else word

    def argv(self, line: str) -> list[str]:
        words = shlex.split(line, comments=True)
        assert is_agent_fsm(words[0])
        head = [sys.executable, "-m", "agent_fsm"] if words[0] == "agent-fsm" else [
            self.place(words[0])]
        return [*head, "--root", str(self.root), *(self.place(w) for w in words[1:])]

    def wait_for(self, what: str, predicate: object, timeout: float = 30) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if predicate():  # type: ignore[operator]
                return
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}")

    # What `agent-fsm daemon` does when systemd (re)starts it ----------------------------
    def daemon_starts(self) -> None:
        node = self.node()
        # systemd creates the unit's RuntimeDirectory= (the gate's directory) at each start.
        node.paths.gate_file.parent.mkdir(parents=True, exist_ok=True)
        state = node.store.read().state
        if state == "converged":
            node.controller.fire("settle")
        elif state == "candidate_running":
            node.controller.fire("candidate_started")
            node.controller.fire("judge_ok")
            node.controller.fire("complete")


def run_line(host: Host, line: str) -> subprocess.CompletedProcess[str]:
    words = shlex.split(line, comments=True)
    command = command_of(line)
    proc = subprocess.Popen(host.argv(line), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=host.env, cwd=host.tmp)
    if command == "upgrade":
        # systemd restarts the agent into the candidate; its daemon judges it and converges.
        host.wait_for("the upgrade to start",
                      lambda: host.node().store.read().state == "candidate_running"
                      or proc.poll() is not None)
        if proc.poll() is None:
            host.daemon_starts()
    first = ""
    if "--watch" in words and "--count" not in words:
        # It runs until interrupted, as documented: Ctrl-C once it shows its first frame (on a
        # loaded machine the start alone may take longer than any fixed wait).
        assert proc.stdout is not None
        first = proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
    try:
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    stdout = first + stdout
    if command == "install":
        host.daemon_starts()  # systemd starts the agent: it converges and opens the gate
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def expected_exit(line: str) -> int:
    words = shlex.split(line, comments=True)
    if "svg" in words and shutil.which("dot") is None:
        return 1  # documented: without graphviz, one line and exit 1
    return 0


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        tuple[Host, list[tuple[str, subprocess.CompletedProcess[str]]]]]:
    host = Host(tmp_path_factory.mktemp("readme"))
    results = []
    for line in command_lines():
        if command_of(line) in NEEDS_SYSTEMD:
            continue
        results.append((line, run_line(host, line)))
    yield host, results


class TestQuickStart:
    def test_every_line_is_runnable_or_named(self) -> None:
        """Each README command line is run here, or its command is one that needs systemd."""
        lines = command_lines()
        assert len(lines) >= 10
        known = {" ".join(p) for p in command_paths()}
        for line in lines:
            command = command_of(line)
            assert command in known, f"README shows an unknown command: {line}"

    def test_every_line_exits_as_documented(self, readme_run: tuple[Host, list[
            tuple[str, subprocess.CompletedProcess[str]]]]) -> None:
        """Each line exits as documented: 0, or 1 with one line when graphviz is missing."""
        _, results = readme_run
        assert results
        for line, proc in results:
            want = expected_exit(line)
            assert proc.returncode == want, f"{line}: exit {proc.returncode}\n{proc.stderr}"
            assert "Traceback" not in proc.stderr, line
            if want == 1:
                assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr

    def test_the_story_the_lines_tell(self, readme_run: tuple[Host, list[
            tuple[str, subprocess.CompletedProcess[str]]]]) -> None:
        """After the lines: converged on 2.0.0 with 1.0.0's history, a metrics file, systemctl
        called, and the upgrade's outcome printed."""
        host, results = readme_run
        out = {line: proc.stdout for line, proc in results}
        upgrade = next(v for k, v in out.items() if k.startswith("agent-fsm upgrade"))
        assert "upgrade to 2.0.0 judged ok; converged on 2.0.0" in upgrade
        node = host.node()
        assert node.store.read().state == "converged"
        assert node.effectors.releases.selected() == node.effectors.releases.last_good() == "2.0.0"
        assert "daemon-reload" in host.systemctl_calls
        bootstrap = next(v for k, v in out.items() if "install --from" in k)
        assert "release 1.0.0 stored at" in " ".join(bootstrap.split())
        link = host.root / "usr" / "local" / "bin" / "agent-fsm"  # the default bin_link
        assert os.readlink(link) == f"{node.config.state_dir}/selected/bin/agent-fsm"
        assert node.effectors.releases.manifest("2.0.0").workload[0] == "{payload_dir}/myagent"
        metrics = next(host.tmp.glob("host/**/*.prom"))
        # The README's releases declare a workload: its two families come too.
        assert types(metrics.read_text()) == {**FAMILIES, **WORKLOAD_FAMILIES}
        history = next(v for k, v in out.items() if k.startswith("agent-fsm history"))
        assert "begin_upgrade" in history and "install" not in history
        status = next(v for k, v in out.items() if k.strip() == "agent-fsm status"
                      or k.startswith("agent-fsm status "))
        assert "converged" in status


class TestDocsMatchTheCommands:
    def test_synopsis_names_every_command(self) -> None:
        """The README's synopsis names every command of the CLI."""
        synopsis = blocks(section("Commands"), "text")[0]
        for words in command_paths():
            assert re.search(rf"\b{re.escape(words[-1])}\b", synopsis), words

    def test_synopsis_options_exist(self) -> None:
        """Every --option the synopsis shows for a command is in that command's --help."""
        from typer.testing import CliRunner

        from agent_fsm.cli.app import app

        synopsis = blocks(section("Commands"), "text")[0]
        for line in synopsis.splitlines():
            words = line.split()
            if not words or words[0] not in {p[0] for p in command_paths()}:
                continue
            for chunk in line.split(" | "):
                cwords = chunk.split()
                path = [w for w in cwords[:2] if re.fullmatch(r"[a-z]+", w)]
                options = set(re.findall(r"--[a-z][a-z-]*", chunk))
                if not options:
                    continue
                help_text = CliRunner().invoke(app, [*path, "--help"]).output
                for option in options:
                    assert option in help_text, f"{' '.join(path)} has no {option}"

    def test_the_machine_diagram_is_the_generated_one(self) -> None:
        """The README's diagram is exactly what `agent-fsm diagram` draws from the definition,
        every transition of states/ in it (orphaned_signal, complete_queued too)."""
        from agent_fsm.upgrade.registry import load_definition
        from agent_fsm.views import diagram

        [drawn] = blocks(section("The machine"), "mermaid")
        assert drawn == diagram.mermaid(diagram.from_definition(load_definition())), (
            "the README's diagram differs from the definition's: paste `agent-fsm diagram`")

    def test_operations_documents_history_and_metrics(self) -> None:
        """docs/operations.md names every history --json key and every metric family."""
        for key in ENTRY_KEYS:
            assert f"`{key}`" in OPERATIONS, key
        for family, kind in {**FAMILIES, **WORKLOAD_FAMILIES}.items():
            name = family + ("_total" if kind == "counter" else "")
            assert f"`{name}`" in OPERATIONS, name

    def test_operations_names_the_journals_and_exit_codes(self) -> None:
        """The runbook shows how to read both units' journals and lists the exit codes."""
        assert "journalctl -u agent-fsm.service" in OPERATIONS
        assert "journalctl -u agent-fsm-recovery.service" in OPERATIONS
        for code in ("| 0 |", "| 1 |", "| 2 |", "| 3 |", "| 4 |"):
            assert code in OPERATIONS

    def test_links_resolve(self) -> None:
        """Every relative link in the README and docs points at a file that exists."""
        for page in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))):
            for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
                assert (page.parent / target).exists(), f"{page.name} links to {target}"

    def test_status_json_example_is_valid(self) -> None:
        """The status --json example in docs/operations.md is valid JSON with every field."""
        from tests.views.test_status import STATUS_KEYS

        examples = [b for b in blocks(OPERATIONS, "json") if '"held_assets"' in b]
        assert examples, "docs/operations.md has no status --json example"
        assert set(json.loads(examples[0])) == STATUS_KEYS
