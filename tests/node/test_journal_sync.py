"""One fsync a transition: journal lines are appended without fsync while the state file carries
a copy of them (`unsynced`), lines lost or garbled by a power loss are repaired from that copy,
readers take it in their place, and a state file whose copy is malformed is refused."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from agent_fsm.errors import StateFileError
from agent_fsm.node.state import journal
from agent_fsm.node.state.store import StateDoc, Store, checksum

STATES = ("a", "b")
K = journal.SYNC_EVERY
LIMIT = 100


def _store(tmp_path: Path) -> Store:
    return Store(tmp_path / "state.json", tmp_path / "state.lock", STATES, "a",
                 triggers=("flip",), effects=())


def _entry(n: int) -> dict[str, Any]:
    source, dest = ("a", "b") if n % 2 else ("b", "a")
    return {"time": float(n), "trigger": "flip", "from": source, "to": dest, "release": None,
            "upgrade": None}


def _record(store: Store, count: int) -> StateDoc:
    """`count` transitions recorded, as the engine records them (read, record, under the lock)."""
    doc = store.read()
    for _ in range(count):
        doc = store.read()
        store.record(doc, _entry(doc.seq + 1), LIMIT)
    return store.read()


def _seqs(store: Store) -> list[int]:
    return [e["seq"] for e in store.history()]


def _file_seqs(store: Store) -> list[int]:
    """The seq of every line of the journal file: each line must decode."""
    return [journal.decode(line)["seq"] for line in store.journal.path.read_bytes().splitlines()]


def _lines(store: Store) -> list[bytes]:
    return store.journal.path.read_bytes().splitlines(keepends=True)


def _to_sync_point(store: Store) -> None:
    """Record transitions until the next one is the one that fsyncs the journal."""
    while len(store.read().unsynced) < K:
        _record(store, 1)


class TestFsyncs:
    def test_a_transition_pays_one_durable_write_and_the_journal_an_fsync_every_k(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Once the journal exists, recording a transition fsyncs the state file and its
        directory only, and every `SYNC_EVERY + 1`-th transition also fsyncs the journal."""
        store = _store(tmp_path)
        _record(store, 1)  # creates the journal (fsynced, with its directory)
        synced: list[str] = []
        real = os.fsync

        def counted(fd: int) -> None:
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))
            real(fd)

        monkeypatch.setattr(os, "fsync", counted)
        per: list[int] = []
        for _ in range(3 * (K + 1)):
            synced.clear()
            _record(store, 1)
            state_file = [p for p in synced if Path(p).name.startswith(".state.json.")]
            assert len(state_file) == 1 and synced.count(str(tmp_path)) == 1, synced
            per.append(synced.count(str(store.journal.path)))
        monkeypatch.undo()
        assert per == ([0] * K + [1]) * 3

    def test_the_state_carries_what_is_not_yet_fsynced(self, tmp_path: Path) -> None:
        """Between sync points the state file carries the entries appended since the last
        one, numbered up to its seq; after a sync point it carries none (and has no key)."""
        store = _store(tmp_path)
        doc = _record(store, 3)
        assert [e["seq"] for e in doc.unsynced] == [2, 3] and doc.seq == 3
        assert json.loads(store.path.read_bytes())["unsynced"] == doc.unsynced
        _to_sync_point(store)
        doc = _record(store, 1)
        assert doc.unsynced == [] and "unsynced" not in json.loads(store.path.read_bytes())
        assert _seqs(store) == _file_seqs(store) == list(range(1, doc.seq + 1))


class TestRepair:
    def test_lines_lost_are_appended_again_from_the_state(self, tmp_path: Path) -> None:
        """The last unsynced lines lost whole (a power loss): `history` still shows them, from
        the state's copy, and the next transition appends them again before its own, in the
        same file (no rewrite)."""
        store = _store(tmp_path)
        doc = _record(store, 5)
        assert len(doc.unsynced) == 4
        store.journal.path.write_bytes(b"".join(_lines(store)[:-3]))  # seq 3, 4, 5 lost
        inode = store.journal.path.stat().st_ino
        assert _seqs(store) == [1, 2, 3, 4, 5]
        assert store.read_journal().damaged == ()
        _record(store, 1)
        assert _file_seqs(store) == _seqs(store) == [1, 2, 3, 4, 5, 6]
        assert store.journal.path.stat().st_ino == inode

    def test_a_torn_unsynced_tail_is_rewritten_with_the_state_copy(self, tmp_path: Path) -> None:
        """Half of the unsynced lines came back (the last one torn): `history` is whole, and
        the next transition rewrites the journal from the lines durable and the state's copy."""
        store = _store(tmp_path)
        _record(store, 5)
        raw = store.journal.path.read_bytes()
        store.journal.path.write_bytes(raw[:len(raw) - len(_lines(store)[-1]) * 5 // 2])
        assert _seqs(store) == [1, 2, 3, 4, 5]
        _record(store, 1)
        assert _file_seqs(store) == _seqs(store) == [1, 2, 3, 4, 5, 6]

    def test_a_hole_among_the_unsynced_lines_is_covered_then_repaired_at_the_sync_point(
            self, tmp_path: Path) -> None:
        """Zeros in place of an unsynced line in the middle (as a power loss may leave): not
        shown nor reported as damage (the state's copy covers it), and the transition that
        fsyncs the journal finds it and rewrites the journal whole."""
        store = _store(tmp_path)
        _record(store, 4)
        lines = _lines(store)
        lines[2] = b"\0" * (len(lines[2]) - 1) + b"\n"  # seq 3
        store.journal.path.write_bytes(b"".join(lines))
        assert _seqs(store) == [1, 2, 3, 4]
        assert store.read_journal().damaged == ()
        _to_sync_point(store)
        assert b"\0" in store.journal.path.read_bytes()  # not looked for between sync points
        doc = _record(store, 1)
        assert doc.unsynced == []
        assert _file_seqs(store) == _seqs(store) == list(range(1, doc.seq + 1))

    def test_damage_before_the_unsynced_lines_is_still_reported(self, tmp_path: Path) -> None:
        """A damaged durable line (before the state's copy begins) is reported as before."""
        store = _store(tmp_path)
        _to_sync_point(store)
        _record(store, 3)
        lines = _lines(store)
        lines[1] = lines[1].replace(b"flip", b"flop")
        store.journal.path.write_bytes(b"".join(lines))
        assert [d.line for d in store.read_journal().damaged] == [2]
        assert 2 not in _seqs(store)

    def test_an_older_writer_that_drops_the_copy_loses_only_lost_lines(
            self, tmp_path: Path) -> None:
        """A state file rewritten by an older agent-fsm (the last-good, during a rollback),
        which does not know `unsynced`, still reads and records: lines that a power loss took
        are missing from the history, nothing else, and the journal stays readable."""
        store = _store(tmp_path)
        _record(store, 5)
        store.journal.path.write_bytes(b"".join(_lines(store)[:-2]))  # seq 4, 5 lost
        data = json.loads(store.path.read_bytes())
        del data["checksum"], data["unsynced"]
        data["checksum"] = checksum(data)
        store.path.write_bytes(json.dumps(data).encode())
        assert _seqs(store) == [1, 2, 3]
        _record(store, 1)
        assert _seqs(store) == [1, 2, 3, 6] and store.read_journal().damaged == ()


MALFORMED: dict[str, tuple[Any, str]] = {
    "not a list": ({"seq": 5}, "unsynced is {'seq': 5}, expected a list"),
    "a gap": ([{**_entry(4), "seq": 3}, {**_entry(5), "seq": 5}],
              "unsynced[0].seq is 3, expected 4 (consecutive, ending at seq 5)"),
    "not ending at seq": ([{**_entry(4), "seq": 4}], "unsynced[0].seq is 4, expected 5"),
    "no seq": ([_entry(5)], "unsynced[0].seq is missing, expected 5"),
    "a trigger that is no name": ([{**_entry(5), "trigger": "Jump!", "seq": 5}],
                                  "unsynced[0].trigger is 'Jump!'"),
    "more than seq": ([{**_entry(i), "seq": i} for i in range(0, 6)],
                      "unsynced has 6 entries, expected at most 5"),
}


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_a_state_file_with_a_malformed_copy_is_refused(tmp_path: Path, kind: str) -> None:
    """A state file whose `unsynced` is not a list of history entries numbered up to its
    seq is refused with one line naming the field and the value, and left untouched."""
    store = _store(tmp_path)
    _record(store, 5)
    data = json.loads(store.path.read_bytes())
    del data["checksum"]
    data["unsynced"], message = MALFORMED[kind]
    data["checksum"] = checksum(data)
    raw = json.dumps(data).encode()
    store.path.write_bytes(raw)
    with pytest.raises(StateFileError, match="left untouched") as caught:
        store.read()
    assert message in str(caught.value) and str(store.path) in str(caught.value)
    assert store.path.read_bytes() == raw
