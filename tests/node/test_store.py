"""The state file: round trip, integrity, refusal of anything it can't trust, lock-free reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_fsm.errors import Refused, StateFileError
from agent_fsm.node.state.store import Pending, StateDoc, Store, Upgrade
from tests.helpers import World

STATES = ("idle", "converged", "candidate_running")
ROOT = Path(__file__).resolve().parents[2]


def _store(tmp_path: Path) -> Store:
    return Store(tmp_path / "state.json", tmp_path / "state.lock", STATES, "idle", lock_timeout=2)


class TestRoundTrip:
    def test_missing_file_reads_as_initial_state(self, tmp_path: Path) -> None:
        """A host that never ran a transition is idle, and reading creates no file."""
        store = _store(tmp_path)
        assert store.read().state == "idle"
        assert not store.path.exists()

    def test_every_field_survives_a_write_and_read(self, tmp_path: Path) -> None:
        """What is written is read back equal: state, upgrade, owed effects, result, and what
        the state keeps of its history (the last seq, the stay, the effects let fail)."""
        store = _store(tmp_path)
        doc = StateDoc(
            state="candidate_running",
            upgrade=Upgrade("1.0.0", "2.0.0", 12.5),
            pending=Pending("complete", "candidate_running", "converged", ["a", "b"], 1,
                            {"release": "2.0.0", "n": 3}, 12.5),
            last_result={"from": "0.9.0", "to": "1.0.0", "outcome": "ok", "started": 1.0,
                         "time": 2.0},
            seq=7, since=1.0, last_transition=2.5,
            skipped=[{"time": 2.5, "trigger": "install", "effect": "reset_start_limit",
                      "error": "refused"}],
        )
        store.write(doc)
        assert store.read() == doc
        assert store.path.stat().st_mode & 0o777 == 0o644
        assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


DAMAGED = {
    "empty": (b"", "is empty"),
    "truncated": (None, "is not valid JSON"),
    "not json": (b"state: idle\n", "is not valid JSON"),
    "not an object": (b"[1, 2]\n", "is not a JSON object"),
    "wrong checksum": (None, "has checksum"),
    "newer schema": (None, "has schema 3, newer than this agent-fsm understands"),
    "unknown state": (None, "names unknown state 'flying'"),
}


def _damaged(kind: str, good: bytes) -> bytes:
    raw, _ = DAMAGED[kind]
    if raw is not None:
        return raw
    if kind == "truncated":
        return good[: len(good) // 2]
    data = json.loads(good)
    if kind == "wrong checksum":
        data["state"] = "idle"
    elif kind == "newer schema":
        data["schema"] = 3
    elif kind == "unknown state":
        data["state"] = "flying"
        data.pop("checksum")
        from agent_fsm.node.state.store import checksum
        data["checksum"] = checksum(data)
    return json.dumps(data).encode()


class TestRefusal:
    @pytest.mark.parametrize("kind", sorted(DAMAGED))
    def test_damaged_file_is_refused_and_left_untouched(self, world: World, kind: str) -> None:
        """A damaged, newer or unknown state file is refused with a message naming the file and
        what to do, and no transition overwrites it."""
        world.installed("1.0.0")
        world.add_release("2.0.0")
        bad = _damaged(kind, world.paths.state_file.read_bytes())
        world.paths.state_file.write_bytes(bad)
        with pytest.raises(StateFileError) as err:
            world.node.controller.fire("begin_upgrade", release="2.0.0")
        message = str(err.value)
        assert str(world.paths.state_file) in message
        assert DAMAGED[kind][1] in message
        assert "left untouched" in message
        assert world.paths.state_file.read_bytes() == bad
        assert world.node.effectors.releases.selected() == "1.0.0"


class TestLocking:
    def test_reader_does_not_wait_for_a_writer(self, world: World) -> None:
        """status reads while another process holds the writers' lock, and the lock file stays."""
        world.installed("1.0.0")
        holder = subprocess.Popen(
            [sys.executable, "-c",
             "import filelock,sys,time; l=filelock.FileLock(sys.argv[1]); l.acquire();"
             "print('held', flush=True); time.sleep(30)", str(world.paths.lock_file)],
            stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            assert world.node.store.read().state == "converged"
        finally:
            holder.kill()
            holder.wait()
        assert world.paths.lock_file.exists()

    def test_writer_gives_up_with_a_clear_refusal(self, tmp_path: Path) -> None:
        """A writer that cannot get the lock in time is refused, naming the lock file."""
        store = _store(tmp_path)
        store.write(StateDoc(state="idle"))
        holder = subprocess.Popen(
            [sys.executable, "-c",
             "import filelock,sys,time; l=filelock.FileLock(sys.argv[1]); l.acquire();"
             "print('held', flush=True); time.sleep(30)", str(store.lock_path)],
            stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            store.lock_timeout = 0.2
            with pytest.raises(Refused, match=r"state\.lock") as refused, store.locked():
                pass
            assert refused.value.exit_code == 3
        finally:
            holder.kill()
            holder.wait()

    def test_the_bytes_depend_on_the_content_only(self, tmp_path: Path) -> None:
        """A document encodes to the same bytes whatever order its tables were built in and in
        whichever process (hash seed) encodes it, so the checksum one process writes is the one
        another recomputes; a different value gives different bytes."""
        code = ("import sys; from agent_fsm.node.state.store import StateDoc, encode\n"
                "pairs = [('rollbacks', 1), ('attempts', 0), ('upgrades_rolled_back', 1),\n"
                "         ('upgrades_ok', int(sys.argv[2]))]\n"
                "order = pairs if sys.argv[1] == 'ba' else pairs[::-1]\n"
                "doc = StateDoc(state='idle', counters=dict(order))\n"
                "sys.stdout.buffer.write(encode(doc))\n")

        def encoded(order: str, seed: str, value: int = 2) -> bytes:
            return subprocess.run([sys.executable, "-c", code, order, str(value)],
                                  env={**os.environ, "PYTHONHASHSEED": seed}, cwd=ROOT,
                                  capture_output=True, check=True, timeout=60).stdout

        written = encoded("ab", "1")
        assert encoded("ba", "2") == written
        assert encoded("ab", "1", value=3) != written
        store = _store(tmp_path)
        store.path.write_bytes(written)
        assert store.read().counters == {"upgrades_ok": 2, "rollbacks": 1, "attempts": 0,
                                         "upgrades_rolled_back": 1}


class TestLayout:
    def test_a_changed_byte_in_the_written_file_is_refused(self, world: World) -> None:
        """Changing one value in the file as written (same layout) breaks its checksum."""
        world.installed("1.0.0")
        raw = world.paths.state_file.read_bytes()
        assert raw.startswith(b'{"checksum":"sha256:')
        tampered = raw.replace(b'"state":"converged"', b'"state":"idle"')
        assert tampered != raw
        world.paths.state_file.write_bytes(tampered)
        with pytest.raises(StateFileError, match="has checksum"):
            world.node.store.read()

    def test_an_older_indented_file_is_still_read(self, world: World) -> None:
        """A state file laid out another way (indented, as earlier versions wrote) still reads."""
        world.installed("1.0.0")
        data = json.loads(world.paths.state_file.read_bytes())
        world.paths.state_file.write_text(json.dumps(data, indent=1))
        assert world.node.store.read().state == "converged"
