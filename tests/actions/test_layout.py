"""The package's shape: a release carries the runtime alone."""

from __future__ import annotations

from pathlib import Path

from agent_fsm.actions.releases.packing import pack


class TestLayout:
    def test_a_packed_release_ships_runtime_code_only(self, tmp_path: Path) -> None:
        """`release pack` copies the runtime package with its definition and its runtime
        dependencies; no harness, no demo, no tests, no test tools travel into a release."""
        release = pack("1.0.0", tmp_path / "rel")
        lib = release / "lib"
        top = {p.name.split("-")[0].removesuffix(".py") for p in lib.iterdir()}
        assert {"agent_fsm", "typer", "rich", "transitions", "filelock"} <= top
        assert not top & {"agent_fsm_lab", "tests", "pytest", "_pytest", "hypothesis", "mypy",
                          "ruff", "importlinter", "hatchling", "pip", "setuptools"}
        names = {p.name for p in (lib / "agent_fsm").rglob("*")}
        assert "agent-upgrade.toml" in names
        assert not names & {"sandbox.py", "lab.py", "demo.py", "conftest.py"}
        assert not (lib / "agent_fsm" / "states").is_symlink()
