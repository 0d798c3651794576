"""Text agent-fsm did not write (a release's workload words, reasons, hold and hook records)
reaches people's terminals with its control characters written visibly, as plain text (no rich
markup or emoji codes interpreted), cut to a bound; `status --json` keeps the exact values."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent_fsm.actions import holds
from agent_fsm.actions.recover import recover
from agent_fsm.node import config as config_mod
from agent_fsm.node.records import hook_failures, known_bad
from tests.helpers import env_with_stub_systemctl, make_world

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
# A title change, a screen clear, rich markup and an emoji code, CR, backspace, a bidi override.
HOSTILE = "\x1b]0;title\x07\x1b[2J[red]x[/red] :warning: \rover\x08\u202eevil"
SHOWN = r"\x1b]0;title\x07\x1b[2J[red]x[/red] :warning: \rover\x08\u202eevil"
RAW = [b"\x1b", b"\r", b"\x08", b"\x07", "\u202e".encode()]
LONG = ["AAAAAAAAA"] * 500  # workload words longer than any view shows whole
MARKUP = "[red]x[/red] :warning: freeze"
CONFIG = ('name = "agent"\n[judgment]\ndeadline_seconds = 60\nsoak_seconds = 5\n'
          '[hooks.after]\ncomplete = ["/usr/local/sbin/undrain", "--now"]\n')


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], dict[str, str]]:
    """A node whose selected release's workload words, last result, known-bad mark, history,
    hook failure, hold and inhibitor all carry hostile text: the argv prefix and environment
    of its `agent-fsm`."""
    base = tmp_path_factory.mktemp("untrusted")
    cfg = base / "config.toml"
    cfg.write_text(CONFIG)
    world = make_world(base / "root", config_mod.load(cfg))
    release = world.add_release("1.0.0")
    words = ", ".join(json.dumps(w) for w in ["/bin/sleep", HOSTILE, *LONG])  # TOML's escapes
    (release / "release.toml").write_text(f'version = "1.0.0"\nworkload = [{words}]\n')
    world.record_digest("1.0.0")
    world.installed("1.0.0").upgrading("2.0.0")
    world.node.controller.fire("judge_failed", reason=f"probe exited 1: {HOSTILE}",
                               reason_class="check_failed")
    recover(world.node)
    world.node.controller.fire("recovered")
    # As an older writer or a hand may have left them: the raw text, not made visible.
    known_bad.mark(world.paths.known_bad_file, known_bad.Mark(
        "2.0.0", world.clock.now(), HOSTILE, "check_failed", started=1.0))
    hook_failures.note(world.paths.state_dir, "after.complete", world.clock.now(), HOSTILE)
    holds.hold(world.node, MARKUP, until=None)
    world.paths.inhibitor_dir.mkdir(parents=True)
    (world.paths.inhibitor_dir / "backup").write_text(f"reason={MARKUP}\n")
    env = {**env_with_stub_systemctl(base), "COLUMNS": "300"}
    return [sys.executable, "-m", "agent_fsm", "--config", str(cfg), "--root",
            str(world.root)], env


def _run(node: tuple[list[str], dict[str, str]], *args: str) -> bytes:
    argv, env = node
    done = subprocess.run([*argv, *args], cwd=ROOT, env=env, capture_output=True, timeout=60,
                          check=False)
    assert not done.stderr or b"Traceback" not in done.stderr, done.stderr.decode()
    return done.stdout + done.stderr


@pytest.mark.parametrize(("command", "shows"), [
    ("status", [SHOWN, MARKUP]),
    ("history", [SHOWN]),
    ("release list", [SHOWN]),
    ("doctor", [SHOWN]),
])
def test_no_raw_control_character_reaches_the_terminal(
        node: tuple[list[str], dict[str, str]], command: str, shows: list[str]) -> None:
    """The human output has no ESC, CR, backspace, BEL or bidi override byte; it shows that
    text written visibly, with markup and emoji codes as the characters they are."""
    out = _run(node, *command.split())
    found = [c for c in RAW if c in out]
    assert not found, f"{command} printed {found}:\n{out!r}"
    flat = re.sub(rb"\s+", b"", out)  # across rich's line wrapping
    for text in shows:
        assert re.sub(r"\s+", "", text).encode() in flat, f"{command} lacks {text!r}:\n{out!r}"


def test_status_shows_a_long_workload_cut(node: tuple[list[str], dict[str, str]]) -> None:
    """A workload of 500 words (5000 characters) is shown cut to a line of 1000 characters
    ending in "…", not wrapped whole over the terminal."""
    out = _run(node, "status")
    assert 50 < out.count(b"AAAAAAAAA") < 100
    assert "A…".encode() in out


def test_status_json_keeps_the_exact_values(node: tuple[list[str], dict[str, str]]) -> None:
    """`status --json` is valid JSON whose strings are the exact values, control characters
    and all (escaped by JSON itself: no raw control byte in it either)."""
    out = _run(node, "status", "--json")
    assert not [c for c in RAW if c in out]
    st = json.loads(out)
    assert st["workload"]["command"] == ["/bin/sleep", HOSTILE, *LONG]
    assert [k["reason"] for k in st["known_bad"]] == [HOSTILE]
    assert st["hooks"][0]["failed"]["error"] == HOSTILE
    assert st["hold"]["reason"] == MARKUP
    assert st["last_result"]["reason"] == f"probe exited 1: {SHOWN}"  # recorded visibly


def test_the_console_shows_a_control_character_no_view_caught(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A control character in text a view passed on whole is still written visibly by the
    console, and markup in a plain string is printed as it is."""
    from rich.text import Text

    from agent_fsm.cli import render

    render.show(Text("a\x1b[2Jb\u202ec"))
    render.out.print("[red]x[/red] \x1b]0;title")
    assert capsys.readouterr().out == "a\\x1b[2Jb\\u202ec\n[red]x[/red] \\x1b]0;title\n"
