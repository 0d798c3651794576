"""What the human views print into a pipe is whole lines: no value is wrapped onto a second
line, whatever COLUMNS says, and no line ends with the padding of a table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent_fsm.actions.recover import recover
from agent_fsm.node import config as config_mod
from tests.helpers import env_with_stub_systemctl, make_world
from tests.views.status_situations import CONFIG

ROOT = Path(__file__).resolve().parents[2]
# A reason long enough for any terminal, in words a wrap could break at.
REASON = "the check " + " ".join(f"probe-{i} answered 503 after 30 s" for i in range(12))
VIEWS = ("status", "history", "doctor", "release list")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    """A node rolled back from 2.0.0 for a long reason: config, root, environment."""
    base = tmp_path_factory.mktemp("piped")
    cfg = base / "config.toml"
    cfg.write_text(CONFIG)
    w = make_world(base / "root", config_mod.load(cfg))
    w.installed("1.0.0").upgrading("2.0.0")
    w.node.controller.fire("judge_failed", reason=REASON, reason_class="check_failed")
    recover(w.node)
    w.node.controller.fire("recovered")
    return cfg, w.root, env_with_stub_systemctl(base)


def _piped(node: tuple[Path, Path, dict[str, str]], view: str, columns: str | None) -> str:
    cfg, root, env = node
    env = {k: v for k, v in env.items() if k not in ("COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE")}
    if columns is not None:
        env["COLUMNS"] = columns
    done = subprocess.run([sys.executable, "-m", "agent_fsm", "--config", str(cfg), "--root",
                           str(root), *view.split()], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    return done.stdout


@pytest.mark.parametrize("columns", [None, "80"])
@pytest.mark.parametrize("view", ["status", "history", "release list"])
def test_a_long_value_stays_on_one_line(node: tuple[Path, Path, dict[str, str]], view: str,
                                        columns: str | None) -> None:
    """Piped, the rollback's long reason is on one line of `status`, `history` and `release
    list`, with COLUMNS unset or set to 80."""
    out = _piped(node, view, columns)
    assert any(REASON in line for line in out.splitlines()), out


@pytest.mark.parametrize("view", VIEWS)
def test_no_line_ends_with_a_space(node: tuple[Path, Path, dict[str, str]], view: str) -> None:
    """Piped, no line of a human view ends with a space."""
    out = _piped(node, view, None)
    assert out.strip()
    padded = [line for line in out.splitlines() if line.endswith(" ")]
    assert not padded, f"{view}: {padded}"
