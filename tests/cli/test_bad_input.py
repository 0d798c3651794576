"""Bad input, through the CLI as a user meets it: one clear line naming the file or value, the
documented exit code, no traceback, and the file left exactly as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import World, make_world

ROOT = Path(__file__).resolve().parents[2]
CONFIG = 'name = "agent"\n[judgment]\ndeadline_seconds = 60\nsoak_seconds = 5\nmax_attempts = 3\n'


def _ready(tmp_path: Path) -> World:
    world = make_world(tmp_path / "root").installed("1.0.0")
    world.add_release("2.0.0")
    return world


def _state(raw: bytes) -> Callable[[World], Path]:
    def plant(world: World) -> Path:
        world.paths.state_file.write_bytes(raw)
        return world.paths.state_file
    return plant


def _edit_state(change: Callable[[dict[str, object]], None], rehash: bool) -> Callable[[World], Path]:
    def plant(world: World) -> Path:
        from agent_fsm.node.state.store import checksum

        data = json.loads(world.paths.state_file.read_bytes())
        change(data)
        if rehash:
            data.pop("checksum")
            data["checksum"] = checksum(data)
        world.paths.state_file.write_text(json.dumps(data))
        return world.paths.state_file
    return plant


def _signal(world: World) -> Path:
    world.paths.signal_file.write_bytes(b"\x00garbage{")
    return world.paths.signal_file


def _manifest(text: str, version: str = "2.0.0") -> Callable[[World], Path]:
    def plant(world: World) -> Path:
        path = world.paths.releases_dir / version / "release.toml"
        path.write_text(text)
        world.record_digest(version)  # stored so: the manifest itself is what is wrong
        return path
    return plant


def _missing_release(world: World) -> Path:
    path = world.paths.releases_dir / "2.0.0" / "release.toml"
    path.unlink()
    world.record_digest("2.0.0")  # stored so: the manifest itself is what is missing
    return path


CASES: dict[str, tuple[Callable[[World], Path], list[str], int, str]] = {
    "state empty": (_state(b""), ["upgrade", "--to", "2.0.0"], 1, "is empty"),
    "state truncated": (_state(b'{"schema": 1, "sta'), ["upgrade", "--to", "2.0.0"], 1,
                        "is not valid JSON"),
    "state not json": (_state(b"state = idle\n"), ["status"], 1, "is not valid JSON"),
    "state wrong checksum": (_edit_state(lambda d: d.update(state="idle"), rehash=False),
                             ["upgrade", "--to", "2.0.0"], 1, "has checksum"),
    "state newer schema": (_edit_state(lambda d: d.update(schema=7), rehash=True),
                           ["status", "--json"], 1, "has schema 7, newer"),
    "state unknown state": (_edit_state(lambda d: d.update(state="flying"), rehash=True),
                            ["recover"], 1, "unknown state 'flying'"),
    "signal garbage": (_signal, ["status", "--json"], 1, "upgrade signal"),
    "release missing": (_missing_release, ["upgrade", "--to", "2.0.0"], 1,
                        "release 2.0.0 is not on this host"),
    "manifest invalid": (_manifest("version = \n"), ["upgrade", "--to", "2.0.0"], 1,
                         "release manifest"),
    "manifest version mismatch": (_manifest('version = "2.0.1"\n'), ["activate", "--to", "2.0.0"],
                                  1, "says version '2.0.1'"),
    "unknown version": (lambda w: w.paths.state_file, ["upgrade", "--to", "9.9.9"], 1,
                        "release 9.9.9 is not on this host"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_and_untouched(tmp_path: Path, case: str) -> None:
    """Each kind of bad file or value: exit code as documented, one line that names it, no
    traceback, and the file byte for byte as it was."""
    plant, argv, code, needle = CASES[case]
    world = _ready(tmp_path)
    world.node.effectors.gate.open()
    path = plant(world)
    before = path.read_bytes() if path.exists() else None
    cfg = tmp_path / "config.toml"
    cfg.write_text(CONFIG)
    proc = subprocess.run([sys.executable, "-m", "agent_fsm", "--config", str(cfg), "--root",
                           str(world.root), *argv], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PATH": "/nonexistent"}, timeout=60, check=False)
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert str(path) in lines[0] or "9.9.9" in lines[0] or "2.0.0" in lines[0]
    assert (path.read_bytes() if path.exists() else None) == before


def test_upgrade_while_pending_is_refused_exit_3(tmp_path: Path) -> None:
    """A second upgrade while one is pending exits 3 and says what is going on."""
    world = _ready(tmp_path)
    world.upgrading("3.0.0")
    cfg = tmp_path / "config.toml"
    cfg.write_text(CONFIG)
    proc = subprocess.run([sys.executable, "-m", "agent_fsm", "--config", str(cfg), "--root",
                           str(world.root), "upgrade", "--to", "2.0.0"], capture_output=True,
                          text=True, cwd=ROOT, timeout=60, check=False)
    assert proc.returncode == 3
    assert "an upgrade to 3.0.0 is being judged" in proc.stderr
