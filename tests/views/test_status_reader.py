"""`status` through the readers' wiring: the same report as through a writer's node in every
situation, the same output and exit code on the lean and full command lines, and none of the
writers' machinery imported by `status --json`."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from agent_fsm.cli import fast_path
from agent_fsm.cli.app import app
from agent_fsm.cli.exits import guarded
from agent_fsm.errors import AgentFsmError, DefinitionError
from agent_fsm.node import config as config_mod
from agent_fsm.testing import FakeClock, FakeSystemd
from agent_fsm.views.status.report import status
from agent_fsm.wiring import open_node, open_reader
from tests.views.status_situations import SITUATIONS, build

ROOT = Path(__file__).resolve().parents[2]
# What only writers need: the engine and its runtime, the effects, the publisher, systemd and
# the hooks' runner (with the subprocess module they run commands through), and the full CLI.
WRITERS_ONLY = ("transitions", "agent_fsm.machine.engine", "agent_fsm.upgrade.effectors",
                "agent_fsm.upgrade.registry", "agent_fsm.system.publish", "agent_fsm.system.systemd",
                "agent_fsm.system.hooks", "subprocess", "filelock", "typer", "rich", "pydantic",
                "click",
                # and what a read costs without needing: dataclasses (each class compiles its
                # methods at import), logging (nothing is logged), OpenSSL (a few KB hashed)
                "dataclasses", "logging", "_hashlib")
# `status --json` run as the console script does, printing on exit which of those it imported.
CHILD = ("import atexit, json, sys\n"
         f"atexit.register(lambda: sys.stderr.write(json.dumps(sorted(\n"
         f"    m for m in {WRITERS_ONLY!r} if m in sys.modules))))\n"
         "sys.argv[0] = 'agent-fsm'\n"
         "from agent_fsm.cli.entry import main\n"
         "main()\n")


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Every situation of tests/views/status_situations.py, built once: its config file and root."""
    base = tmp_path_factory.mktemp("situations")
    return {name: build(base / f"s{i}", name) for i, name in enumerate(SITUATIONS)}


def _outcome(make: Callable[[], dict[str, Any]]) -> tuple[str, Any]:
    try:
        report = make()
        report["store"].pop("free_bytes")  # read live: other writers move it between two reads
        return "report", report
    except AgentFsmError as exc:
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("situation", list(SITUATIONS))
def test_the_reader_reports_what_a_writers_node_reports(nodes: dict[str, tuple[Path, Path]],
                                                        situation: str) -> None:
    """In every situation (converged, mid-upgrade, rolled back, held, inhibited, a failed hook,
    owed effects, damaged files, a config a writer refuses) `status` read through the readers'
    wiring is the report a writer's fully wired node gives, field for field, or the same error."""
    cfg, root = nodes[situation]
    clock = FakeClock(t=1_800_000_000.0)

    def through(wire: Callable[[config_mod.Config], Any]) -> tuple[str, Any]:
        return _outcome(lambda: status(wire(config_mod.load(cfg, root)), diff=True).to_json())

    read = through(lambda c: open_reader(c, root, clock=clock))
    written = through(lambda c: open_node(c, root, systemd=FakeSystemd(), clock=clock))
    assert read == written
    assert (read[0] == "report") == (situation not in {
        "damaged state file", "damaged signal", "hook for an unknown trigger"})


def _without_times(out: str) -> str:
    """The output less the lines that move between two runs (the time, the seconds since, the
    free space)."""
    return "".join(ln for ln in out.splitlines(True) if '"time"' not in ln
                   and '_seconds"' not in ln and '"free_bytes"' not in ln)


def _full(argv: Sequence[str]) -> int | None:
    """The full command line's exit code, as its console script (`app.main`) exits."""
    try:
        return guarded(lambda: app(list(argv)))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1


def test_lean_and_full_status_json_agree_in_every_situation(
        nodes: dict[str, tuple[Path, Path]], capsys: pytest.CaptureFixture[str]) -> None:
    """`status --json` prints the same object, the same one-line error and exits with the same
    code whether the lean entry or the full command line serves it, in every situation."""
    for situation, (cfg, root) in nodes.items():
        argv = ["--config", str(cfg), "--root", str(root), "status", "--json"]
        seen = []
        for run in (fast_path.main, _full):
            code = run(argv)
            out, err = capsys.readouterr()
            seen.append((code, _without_times(out), err))
        assert seen[0] == seen[1], situation
        assert seen[0][0] == (1 if seen[0][2] else 0), situation


def test_status_json_imports_none_of_the_writers_machinery(
        nodes: dict[str, tuple[Path, Path]]) -> None:
    """`agent-fsm status --json`, a fresh process as a fleet tool runs it, reads a node mid-upgrade
    without importing the engine (nor `transitions`), the effects, the publisher, systemd, the
    hooks' runner, subprocess, filelock, or the full CLI's typer, rich, pydantic and click; nor
    dataclasses, logging or OpenSSL, which a read does not need."""
    cfg, root = nodes["pending upgrade"]
    proc = subprocess.run([sys.executable, "-c", CHILD, "--config", str(cfg), "--root", str(root),
                           "status", "--json"], cwd=ROOT, capture_output=True, text=True,
                          check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["state"] == "candidate_running"
    assert json.loads(proc.stderr) == []


def test_a_definition_lacking_a_name_the_code_uses_is_refused_by_readers_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A shipped definition that lost a state the code names (here `judged_ok`, renamed) is
    refused when `status` loads it, with the same message writers give, naming the state."""
    from agent_fsm.machine import definition, reading
    from agent_fsm.upgrade import registry

    text, source = definition.default_text()
    renamed = text.replace("judged_ok", "judged_good")
    monkeypatch.setattr(definition, "default_text", lambda: (renamed, source))
    refusals = []
    for load in (reading.shipped, registry.load_definition):
        with pytest.raises(DefinitionError) as caught:
            load()
        refusals.append(str(caught.value))
    assert refusals[0] == refusals[1] and "state judged_ok" in refusals[0]
