"""A damaged selected release (changed since it was added: the agent cannot start it) is an
error in `doctor` (exit 1) and in `status` (a line and a `next` with the fix; in `--json`,
`selected_damaged`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent_fsm.views.doctor.checks import doctor
from agent_fsm.views.status.report import status
from tests.helpers import World, env_with_stub_systemctl, make_world

CONFIG = 'name = "agent"\n[judgment]\ndeadline_seconds = 60\nsoak_seconds = 5\n'


@pytest.fixture
def node(tmp_path: Path) -> tuple[World, Path]:
    """An installed, converged node (1.0.0) and its config file."""
    world = make_world(tmp_path / "root").installed("1.0.0")
    cfg = tmp_path / "config.toml"
    cfg.write_text(CONFIG)
    return world, cfg


def _damage(world: World, version: str) -> None:
    """Change a file of a stored release behind the store's back (an editor, another tool)."""
    manifest = world.node.releases.path(version) / "release.toml"
    manifest.write_text(manifest.read_text() + "# edited by hand\n")


def _cli(world: World, cfg: Path, *args: str,
         agent: str = "activating auto-restart") -> subprocess.CompletedProcess[str]:
    """Run the CLI with a systemctl stub whose `show` says the agent unit is `agent`
    (ActiveState and SubState: by default restarting, as a node whose release fails)."""
    env = env_with_stub_systemctl(cfg.parent)
    active, sub = agent.split()
    shown = f"ActiveState={active}\\nSubState={sub}\\n\\nActiveState=inactive\\nSubState=dead\\n"
    (cfg.parent / "bin" / "systemctl").write_text(
        '#!/bin/sh\n[ "$1" = --version ] && echo "systemd 252 (252)"\n'
        f'[ "$1" = show ] && printf "{shown}"\nexit 0\n')
    return subprocess.run([sys.executable, "-m", "agent_fsm", "--config", str(cfg), "--root",
                           str(world.root), *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


class TestDoctor:
    def test_a_damaged_selected_release_fails(self, node: tuple[World, Path]) -> None:
        """The selected release changed since it was added: a `release` failure naming it,
        what changed, and the fix (add it again, restart the agent)."""
        world, _ = node
        assert [f.level for f in doctor(world.node, check_systemd=False)
                if f.check == "release"] == ["ok"]
        _damage(world, "1.0.0")
        [found] = [f for f in doctor(world.node, check_systemd=False) if f.check == "release"]
        assert found.level == "fail"
        assert found.detail.startswith("the selected release 1.0.0 is damaged: ")
        assert "release.toml changed content" in found.detail
        assert found.fix == ("add release 1.0.0 again (`agent-fsm release add DIR`, DIR: its "
                             "directory or image; it replaces the damaged copy), then "
                             "`systemctl restart agent.service`")

    def test_a_damaged_last_good_fails_too(self, tmp_path: Path) -> None:
        """Mid-upgrade, a damaged last-good (whose code runs the way back) is a failure too."""
        world = make_world(tmp_path / "root").installed("1.0.0").upgrading("2.0.0")
        _damage(world, "1.0.0")
        [found] = [f for f in doctor(world.node, check_systemd=False) if f.check == "release"]
        assert found.level == "fail"
        assert found.detail.startswith("the last-good release 1.0.0 is damaged: ")

    def test_doctor_exits_1(self, node: tuple[World, Path]) -> None:
        """`doctor` exits 1 on a damaged selected release, its JSON and its table say so."""
        world, cfg = node
        _damage(world, "1.0.0")
        done = _cli(world, cfg, "doctor", "--json")
        assert done.returncode == 1, done.stderr
        failing = {f["check"]: f for f in json.loads(done.stdout) if f["level"] == "fail"}
        assert failing["release"]["detail"].startswith("the selected release 1.0.0 is damaged")
        human = _cli(world, cfg, "doctor")
        assert human.returncode == 1
        assert any(line.startswith("FAIL") and "release" in line
                   for line in human.stdout.splitlines())


class TestStatus:
    def test_intact_is_null(self, node: tuple[World, Path]) -> None:
        """An intact selected release: `selected_damaged` is null, even with the agent down."""
        world, cfg = node
        assert json.loads(_cli(world, cfg, "status", "--json").stdout)["selected_damaged"] is None
        assert status(world.node).selected_damaged is None

    def test_json_says_it_and_next_is_the_fix(self, node: tuple[World, Path]) -> None:
        """`status --json` has `selected_damaged` {version, problem}, and `next` says to add
        the release again and restart the agent instead of "wait"."""
        world, cfg = node
        _damage(world, "1.0.0")
        done = _cli(world, cfg, "status", "--json")
        assert done.returncode == 0, done.stderr
        st = json.loads(done.stdout)
        assert st["selected_damaged"]["version"] == "1.0.0"
        assert "release.toml changed content" in st["selected_damaged"]["problem"]
        assert st["next"]["summary"].startswith("the selected release 1.0.0 is damaged and the "
                                                "agent cannot start it")
        assert st["next"]["commands"][:2] == [
            f"agent-fsm --config {cfg} --root {world.root} release add DIR",
            "systemctl restart agent.service"]

    def test_a_running_agent_is_not_walked(self, node: tuple[World, Path]) -> None:
        """While the agent unit runs (its release checked when it started), `status` does not
        walk the release again: `selected_damaged` is null and `doctor` is the one to ask."""
        world, cfg = node
        _damage(world, "1.0.0")
        st = json.loads(_cli(world, cfg, "status", "--json", agent="active running").stdout)
        assert st["selected_damaged"] is None

    def test_human_status_has_a_line_with_the_fix(self, node: tuple[World, Path]) -> None:
        """`status` shows a `damaged` line saying what changed and how to fix it."""
        world, cfg = node
        _damage(world, "1.0.0")
        out = _cli(world, cfg, "status").stdout
        [line] = [ln for ln in out.splitlines() if ln.startswith("damaged")]
        assert "release 1.0.0 is not what was stored" in line
        assert "release add" in out and "systemctl restart agent.service" in out
