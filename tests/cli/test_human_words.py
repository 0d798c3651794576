"""What people read (`status`, `history`, `doctor`, `release list` without --json) shows no
Python `None` and no value spelt as JSON spells it (`rolled_back`, `check_failed`); the JSON
keeps those values, which scripts read."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import env_with_stub_systemctl
from tests.views.status_situations import SITUATIONS, build

ROOT = Path(__file__).resolve().parents[2]
# JSON's names for values that people read as words.
NAMES = re.compile(r"\bNone\b|\brolled_back\b|\bcheck_failed\b|\breason_class\b")
SHOWN = {"status": ["nothing installed", "pending upgrade", "judged failed", "rolled back",
                    "held", "hook failed", "owed effects", "damaged signal"],
         "history": ["judged failed", "rolled back", "owed effects"],
         "doctor": ["rolled back", "pending upgrade"],
         "release list": ["rolled back"]}


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path, dict[str, str]]]:
    """Every situation `status` reports, built once: config file, root, environment."""
    base = tmp_path_factory.mktemp("words")
    env = {**env_with_stub_systemctl(base), "COLUMNS": "300"}
    shown = sorted({name for names in SHOWN.values() for name in names}, key=list(SITUATIONS).index)
    return {name: (*build(base / f"s{i}", name), env) for i, name in enumerate(shown)}


def _run(node: tuple[Path, Path, dict[str, str]], *args: str) -> str:
    cfg, root, env = node
    done = subprocess.run([sys.executable, "-m", "agent_fsm", "--config", str(cfg), "--root",
                           str(root), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    return done.stdout + done.stderr


@pytest.mark.parametrize("command", list(SHOWN))
def test_no_python_none_nor_json_names(nodes: dict[str, tuple[Path, Path, dict[str, str]]],
                                       command: str) -> None:
    """In every situation the command is shown in, its human output has no `None` and no
    `rolled_back` or `check_failed`."""
    for situation in SHOWN[command]:
        out = _run(nodes[situation], *command.split())
        found = NAMES.findall(out)
        assert not found, f"{command} in {situation!r} shows {found}:\n{out}"


def test_a_rollback_reads_as_words(nodes: dict[str, tuple[Path, Path, dict[str, str]]]) -> None:
    """After a rollback, `status` says "rolled back" and "check failed" and lists the commands
    that may run (`upgrade`, not `begin_upgrade`), while `--json` keeps `rolled_back`."""
    node = nodes["rolled back"]
    out = _run(node, "status")
    assert "1.0.0 → 2.0.0: rolled back at " in out and " — check failed: " in out
    [row] = [line for line in out.splitlines() if line.startswith("commands")]
    assert row.split(None, 1)[1] == "install, activate, upgrade (allowed now)"
    st = json.loads(_run(node, "status", "--json"))
    assert (st["last_result"]["outcome"], st["last_result"]["reason_class"]) == (
        "rolled_back", "check_failed")
    assert "begin_upgrade" in st["allowed"]
