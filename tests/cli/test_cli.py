"""The command line as a user runs it: a real process, real files, exit codes, no tracebacks."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import World, make_world

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "AGENT_FSM_CONFIG"}
    full_env.update(env or {})
    full_env["COLUMNS"] = "200"
    return subprocess.run([sys.executable, "-m", "agent_fsm", *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd, timeout=60, check=False)


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text('name = "agent"\n[judgment]\ndeadline_seconds = 60\nsoak_seconds = 5\n')
    return path


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("agent-fsm: ")
    return lines[0]


class TestStatus:
    def test_empty_root_is_idle(self, tmp_path: Path, cfg: Path) -> None:
        """On an empty root, `status --json` reports idle with every documented field."""
        proc = run("--config", str(cfg), "--root", str(tmp_path / "root"), "status", "--json")
        assert proc.returncode == 0, proc.stderr
        data = json.loads(proc.stdout)
        assert data["state"] == "idle"
        for key in ("selected", "last_good", "signal", "gate", "held_assets", "last_result"):
            assert key in data
        assert data["gate"] == "closed" and data["signal"] is None and data["held_assets"] == []

    def test_mid_upgrade_shows_signal_and_held_assets(self, tmp_path: Path, cfg: Path) -> None:
        """During an upgrade, status shows the signal, the held assets and the closed gate."""
        world = make_world(tmp_path / "root")
        world.installed("1.0.0").upgrading("2.0.0")
        proc = run("--config", str(cfg), "--root", str(world.root), "status", "--json")
        data = json.loads(proc.stdout)
        assert data["state"] == "candidate_running"
        assert (data["signal"]["from"], data["signal"]["to"], data["signal"]["attempt"]) == (
            "1.0.0", "2.0.0", 1)
        assert data["gate"] == "closed"
        assert sorted(Path(p).name for p in data["held_assets"]) == [
            "agent-recovery.service", "agent-recovery.sh", "agent.service"]
        human = run("--config", str(cfg), "--root", str(world.root), "status")
        assert "candidate_running" in human.stdout
        assert "an upgrade to 2.0.0 is being judged" in human.stdout

    def test_config_from_environment(self, tmp_path: Path, cfg: Path) -> None:
        """AGENT_FSM_CONFIG works as --config does."""
        world = make_world(tmp_path / "root")
        world.installed("1.0.0")
        proc = run("--root", str(world.root), "status", "--json",
                   env={"AGENT_FSM_CONFIG": str(cfg)})
        assert json.loads(proc.stdout)["selected"] == "1.0.0"

    def test_damaged_state_file_one_line_and_untouched(self, tmp_path: Path, cfg: Path) -> None:
        """A damaged state file gives exit 1 and one line naming it; the file stays as it was."""
        world = make_world(tmp_path / "root")
        world.installed("1.0.0")
        world.paths.state_file.write_bytes(b'{"schema": 1, "state": "idle"')
        proc = run("--config", str(cfg), "--root", str(world.root), "status", "--json")
        assert proc.returncode == 1
        assert str(world.paths.state_file) in one_line_error(proc)
        assert world.paths.state_file.read_bytes() == b'{"schema": 1, "state": "idle"'


class TestReleaseList:
    def test_an_empty_store_says_so(self, tmp_path: Path, cfg: Path) -> None:
        """`release list` with nothing stored says where it looked and how to add one (exit 0);
        `--json` gives an empty list."""
        root = ["--config", str(cfg), "--root", str(tmp_path / "root")]
        proc = run(*root, "release", "list")
        assert proc.returncode == 0 and "no releases stored in " in proc.stdout
        assert "agent-fsm release add DIR" in proc.stdout
        assert json.loads(run(*root, "release", "list", "--json").stdout) == []


class TestConfigErrors:
    @pytest.mark.parametrize(("text", "needle"), [
        ("nmae = 'x'\n", "unknown key `nmae`"),
        ("[judgment]\nmax_atempts = 3\n", "unknown key `judgment.max_atempts`"),
        ("[judgment]\ndeadline_seconds = 'soon'\n", "`judgment.deadline_seconds` is 'soon'"),
        ("state_dir = 'relative'\n", "`state_dir` is 'relative'; expected an absolute path"),
        ("name = [\n", "is not valid TOML"),
    ], ids=["unknown key", "unknown judgment key", "wrong type", "relative path", "unparsable"])
    def test_bad_config_is_one_clear_line(self, tmp_path: Path, text: str, needle: str) -> None:
        """A bad config gives exit 1 and one line naming the file and the key or value."""
        cfg = tmp_path / "bad.toml"
        cfg.write_text(text)
        proc = run("--config", str(cfg), "status")
        assert proc.returncode == 1
        line = one_line_error(proc)
        assert str(cfg) in line and needle in line

    def test_missing_explicit_config(self, tmp_path: Path) -> None:
        """A config named explicitly but missing is an error, not a silent default."""
        proc = run("--config", str(tmp_path / "nope.toml"), "status")
        assert proc.returncode == 1
        assert "does not exist" in one_line_error(proc)


class TestHistoryDiagramUsage:
    def test_history_lists_transitions(self, tmp_path: Path, cfg: Path) -> None:
        """history --json lists the transitions taken, oldest first, with versions."""
        world = make_world(tmp_path / "root")
        world.installed("1.0.0").upgrading("2.0.0")
        proc = run("--config", str(cfg), "--root", str(world.root), "history", "--json")
        entries = json.loads(proc.stdout)
        assert [(e["trigger"], e["to"]) for e in entries] == [
            ("install", "converged"), ("settle", "converged"),
            ("begin_upgrade", "candidate_running"), ("candidate_started", "candidate_running")]
        assert entries[2]["upgrade"] == {"from": "1.0.0", "to": "2.0.0"}
        limited = run("--config", str(cfg), "--root", str(world.root), "history", "--json",
                      "--limit", "1")
        assert [e["trigger"] for e in json.loads(limited.stdout)] == ["candidate_started"]

    def test_diagram_dot_highlights_current_state(self, tmp_path: Path, cfg: Path) -> None:
        """diagram --format dot --current fills the node's current state."""
        world = make_world(tmp_path / "root")
        world.installed("1.0.0")
        proc = run("--config", str(cfg), "--root", str(world.root), "diagram", "--format", "dot",
                   "--current")
        filled = [line for line in proc.stdout.splitlines() if "filled" in line]
        assert len(filled) == 1 and filled[0].strip().startswith("converged")

    def test_usage_error_is_exit_2(self) -> None:
        """An unknown command or option exits 2."""
        assert run("frobnicate").returncode == 2
        assert run("status", "--jsn").returncode == 2

    def test_help_lists_exit_codes(self) -> None:
        """--help documents the exit codes."""
        proc = run("--help")
        assert proc.returncode == 0
        assert "3" in proc.stdout and "refused" in proc.stdout and "rolled back" in proc.stdout


def command_paths() -> list[tuple[str, ...]]:
    """Every command and subcommand of the CLI, as the words that name it."""
    import typer

    from agent_fsm.cli.app import app

    def walk(t: typer.Typer, words: tuple[str, ...]) -> list[tuple[str, ...]]:
        found = []
        for c in t.registered_commands:
            assert c.callback is not None
            found.append((*words, c.name or c.callback.__name__.replace("_", "-")))
        for g in t.registered_groups:
            assert g.name is not None and g.typer_instance is not None
            found.append((*words, g.name))
            found += walk(g.typer_instance, (*words, g.name))
        return found

    return walk(app, ())


class TestHelp:
    def test_every_command_is_found(self) -> None:
        """The walk over the CLI finds the commands the README lists, release's included."""
        names = {" ".join(p) for p in command_paths()}
        assert {"status", "history", "diagram", "metrics", "install", "upgrade", "activate",
                "recover", "daemon", "release", "release pack", "release add",
                "release list", "release prune"} <= names

    @pytest.mark.parametrize("words", command_paths(), ids=" ".join)
    def test_every_command_has_help_with_an_example_and_exit_codes(
            self, words: tuple[str, ...]) -> None:
        """`agent-fsm … --help` works for every command and shows an example and the exit codes."""
        from typer.testing import CliRunner

        from agent_fsm.cli.app import app

        result = CliRunner().invoke(app, [*words, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        text = " ".join(result.output.split())  # help is wrapped at the terminal's width
        assert re.search(r"Example[^:]*: (sudo )?\S*agent-fsm ", text), text
        assert "Exit codes: 0 success; 1 error" in text
        assert "4 (`upgrade --wait`)" in text

    def test_completion_and_version_are_offered(self) -> None:
        """Top-level help offers shell completion and --version; --version prints it."""
        from agent_fsm import __version__

        proc = run("--help")
        for option in ("--install-completion", "--show-completion", "--version"):
            assert option in proc.stdout
        version = run("--version")
        assert version.returncode == 0 and version.stdout == f"agent-fsm {__version__}\n"

    def test_show_completion_prints_a_script(self) -> None:
        """--show-completion prints a completion script for the named shell."""
        proc = run("--show-completion", "bash", env={"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"})
        assert proc.returncode == 0, proc.stderr
        assert "complete" in proc.stdout and "agent" in proc.stdout


def test_world_fixture_is_isolated(world: World) -> None:
    """Every path the node writes is below the test's own root."""
    world.installed("1.0.0")
    for p in (world.paths.state_file, world.paths.agent_unit, world.paths.gate_file):
        assert world.root in p.parents


class TestStatusFastPath:
    @pytest.mark.parametrize("setup", ["converged", "upgrading", "damaged", "bad config"])
    def test_fast_path_matches_full_cli(self, tmp_path: Path, cfg: Path, setup: str) -> None:
        """`status --json` served without building the full CLI prints the same bytes, messages
        and exit code as the full CLI does."""
        world = make_world(tmp_path / "root")
        world.installed("1.0.0")
        config = cfg
        if setup == "upgrading":
            world.upgrading("2.0.0")
        elif setup == "damaged":
            world.paths.state_file.write_text("{")
        elif setup == "bad config":
            config = tmp_path / "bad.toml"
            config.write_text("nmae = 1\n")
        args = ["--config", str(config), f"--root={world.root}", "status", "--json"]
        fast = run(*args)
        full = subprocess.run(
            [sys.executable, "-c", "import sys; from agent_fsm.cli.app import main; "
             "sys.argv[0] = 'agent-fsm'; main()", *args],
            capture_output=True, text=True, cwd=ROOT, timeout=60, check=False,
            env={k: v for k, v in os.environ.items() if k != "AGENT_FSM_CONFIG"})
        assert (fast.returncode, fast.stderr) == (full.returncode, full.stderr)
        strip = lambda out: [line for line in out.splitlines() if '"time"' not in line  # noqa: E731
                             and "_seconds" not in line and '"free_bytes"' not in line]
        assert strip(fast.stdout) == strip(full.stdout)

    @pytest.mark.parametrize("argv", [
        ["status", "--json", "--help"], ["status", "--json", "--diff"], ["--verbose", "status", "--json"],
        ["--root", "status", "--json"], ["status", "--json", "extra"], ["recover", "--json"]])
    def test_other_shapes_answer_as_the_full_cli(self, tmp_path: Path, cfg: Path,
                                                 argv: list[str]) -> None:
        """A command line near a lean shape but not one of them (help, an option more, a missing
        value) gets the full CLI's answer: its help, its usage error or its output, same exit."""
        world = make_world(tmp_path / "root")
        world.installed("1.0.0")
        args = ["--config", str(cfg), *(argv if argv[0] == "--root" else
                                        ["--root", str(world.root), *argv])]
        env = {**{k: v for k, v in os.environ.items() if k != "AGENT_FSM_CONFIG"}, "COLUMNS": "200"}

        def through(module: str) -> subprocess.CompletedProcess[str]:  # as the console script
            return subprocess.run(
                [sys.executable, "-c", f"import sys; from agent_fsm.cli.{module} import main; "
                 "sys.argv[0] = 'agent-fsm'; main()", *args],
                capture_output=True, text=True, cwd=ROOT, timeout=60, check=False, env=env)

        entry, full = through("entry"), through("app")
        strip = lambda out: [line for line in out.splitlines() if '"time"' not in line  # noqa: E731
                             and "_seconds" not in line and '"free_bytes"' not in line]
        assert (entry.returncode, entry.stderr) == (full.returncode, full.stderr)
        assert strip(entry.stdout) == strip(full.stdout)
