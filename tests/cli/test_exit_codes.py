"""The exit codes are the documented ones (docs/operations.md's table, `--help`): each code's
cases run through the command line, and each is in the row that the docs give its code."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import env_with_stub_systemctl
from tests.views.status_situations import build

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = (ROOT / "docs" / "operations.md").read_text()
ROWS = dict(re.findall(r"^\| ([0-4]) \| (.+) \|$", OPERATIONS, re.M))
# situation, commands run first (each must exit 0), the command, its code, the docs' words for it
CASES = {
    "success": ("converged", [], ["status"], 0, "success"),
    "unknown release": ("converged", [], ["upgrade", "--to", "9.9.9"], 1, "error"),
    "unknown option": ("converged", [], ["status", "--jsn"], 2, "unknown command or option"),
    "upgrade pending": ("pending upgrade", [], ["upgrade", "--to", "2.0.0"], 3,
                        "an upgrade is pending"),
    "held": ("converged", [["hold", "--reason", "change freeze"]], ["upgrade", "--to", "2.0.0"],
             3, "upgrades are held"),
    "known bad": ("rolled back", [], ["upgrade", "--to", "2.0.0"], 3, "known bad"),
    "not allowed now": ("nothing installed", [], ["upgrade", "--to", "1.0.0"], 3,
                        "not allowed in the current state"),
}


def _run(cfg: Path, root: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent_fsm", "--config", str(cfg), "--root",
                           str(root), *args], cwd=ROOT, env=env_with_stub_systemctl(cfg.parent),
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("case", list(CASES))
def test_the_code_is_the_documented_one(tmp_path: Path, case: str) -> None:
    """The command exits with the code whose row in docs/operations.md names its case, and an
    error or refusal is one line on stderr."""
    situation, before, args, code, words = CASES[case]
    assert words in ROWS[str(code)], f"docs/operations.md's row {code} does not name {case}"
    cfg, root = build(tmp_path, situation)
    for first in before:
        assert _run(cfg, root, first).returncode == 0
    done = _run(cfg, root, args)
    assert done.returncode == code, done.stderr
    if code in (1, 3):
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_help_and_docs_list_the_same_codes() -> None:
    """`--help` and docs/operations.md both document 0 to 4, and 4 as a rollback."""
    from agent_fsm.cli.exits import EXIT_CODES

    assert sorted(ROWS) == ["0", "1", "2", "3", "4"]
    for code in "01234":
        assert re.search(rf"\b{code} ", EXIT_CODES), code
    assert "rolled back" in ROWS["4"] and "rolled back" in EXIT_CODES


def test_an_unknown_release_is_an_error_wherever_the_docs_say_it() -> None:
    """No page calls an unknown release a refusal (3): it is an error, exit 1, as the code
    does."""
    for page in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))):
        text = " ".join(page.read_text().split())
        for found in re.finditer(r"unknown release", text):
            after = text[found.end():found.end() + 60]
            assert "exit 1" in after, (page.name, text[found.start() - 80:found.end() + 60])
