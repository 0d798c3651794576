"""The definition as `status` loads it: the same machine and refusals as a writer's, at a
reader's cost (its TOML parsed once, no dataclass compiled, `logging` not imported)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from agent_fsm.errors import DefinitionError
from agent_fsm.machine import definition, reading
from agent_fsm.upgrade import registry

ROOT = Path(__file__).resolve().parents[2]


def test_a_reader_loads_the_same_machine_as_a_writer() -> None:
    """`status` sees the machine a writer runs: states, transitions and effects compare equal
    field by field, and a reloaded definition equals (and hashes as) the first."""
    d = reading.shipped()
    assert d == registry.load_definition()
    assert hash(d) == hash(reading.shipped())
    assert d.transition("begin_upgrade").effect_names[0] == "close_gate"


def test_a_shipped_definition_that_is_not_toml_is_refused_by_readers_as_by_writers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A damaged shipped definition (not TOML) stops `status` with the writers' message, naming
    the file and what the parser found."""
    text, source = definition.default_text()
    monkeypatch.setattr(definition, "default_text", lambda: (text + "\n[machine\n", source))
    refusals = []
    for load in (reading.shipped, registry.load_definition):
        with pytest.raises(DefinitionError) as caught:
            load()
        refusals.append(str(caught.value))
    assert refusals[0] == refusals[1]
    assert refusals[0].startswith(f"{source} is not valid TOML: ")


def test_a_reader_parses_the_definition_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading the definition for `status` parses its TOML once (each parse costs ~1.4 ms of
    every `status --json` a fleet tool runs)."""
    calls: list[int] = []
    loads = tomllib.loads

    def counted(text: str, **kwargs: Any) -> dict[str, Any]:
        calls.append(len(text))
        return loads(text, **kwargs)

    monkeypatch.setattr(tomllib, "loads", counted)
    reading.shipped()
    assert len(calls) == 1


def test_a_reader_loading_the_definition_compiles_no_dataclass_and_imports_no_logging() -> None:
    """In a fresh process, loading the definition as `status` does, with the file helpers it
    reads through, imports neither `dataclasses` (each dataclass compiles its methods at
    import, ≈ 0.75 ms) nor `logging` (imported where something is logged)."""
    child = ("import sys\n"
             "import agent_fsm.files\n"
             "from agent_fsm.machine import reading\n"
             "reading.shipped()\n"
             "print(sorted(m for m in ('dataclasses', 'logging') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", child], cwd=ROOT, capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out.strip() == "[]"
