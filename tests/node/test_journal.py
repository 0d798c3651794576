"""The history journal beside the state file: one checksummed line per transition, committed by
the state file's `seq`, repaired and bounded by the writer, read without the lock, and never
read by `status`."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from agent_fsm.errors import StateFileError
from agent_fsm.node.config import Config, Judgment
from agent_fsm.node.state import journal
from agent_fsm.node.state.store import KIND, StateDoc, Store
from agent_fsm.views.doctor.checks import doctor
from agent_fsm.views.history import history
from agent_fsm.views.metrics import collect
from agent_fsm.views.status.report import status
from tests.cli.test_cli import run
from tests.helpers import DEFAULT_CONFIG, World, copy_tree, make_world
from tests.views.test_history import good_then_failed

CONFIG = 'name = "agent"\n[judgment]\ndeadline_seconds = 60\nsoak_seconds = 5\n'
TRAIL = ["install", "settle", "begin_upgrade", "candidate_started", "judge_ok", "complete",
         "begin_upgrade", "candidate_started", "judge_failed", "recover", "recovered"]


@pytest.fixture(scope="module")
def moved(tmp_path_factory: pytest.TempPathFactory) -> World:
    """A good upgrade then a failed one (`good_then_failed`), built once for the module."""
    return good_then_failed(make_world(tmp_path_factory.mktemp("moved") / "root"))


@pytest.fixture
def upgraded(moved: World, tmp_path: Path) -> World:
    """A copy of `moved` of this test's own, with the same clock."""
    copy_tree(moved.root, tmp_path / "root")
    return make_world(tmp_path / "root", clock=moved.clock)


def _triggers(world: World) -> list[str]:
    return [e.trigger for e in history(world.node).entries]


def _lines(world: World) -> list[bytes]:
    return world.node.store.journal.path.read_bytes().splitlines()


class TestLines:
    def test_each_transition_is_one_checksummed_line_committed_by_the_state(
            self, upgraded: World) -> None:
        """Each transition appends one line (its own CRC-32 first, then its `seq`), and the
        state file names the last one, keeping no history of its own."""
        lines = _lines(upgraded)
        assert [journal.decode(line)["seq"] for line in lines] == list(range(1, 12))
        assert all(line.startswith(b'{"crc32":"') for line in lines)
        assert [journal.decode(line)["trigger"] for line in lines] == TRAIL
        state = json.loads(upgraded.paths.state_file.read_bytes())
        assert state["schema"] == 2 and state["seq"] == 11 and "history" not in state
        assert upgraded.node.store.journal.path.stat().st_mode & 0o777 == 0o644

    def test_status_and_metrics_never_read_the_journal(self, tmp_path: Path) -> None:
        """`status --json` (the lean path), `status` and `metrics` answer the same with the
        journal unreadable: they read the state file only."""
        world = good_then_failed(make_world(tmp_path / "root"))
        (tmp_path / "config.toml").write_text(CONFIG)
        args = ("--config", str(tmp_path / "config.toml"), "--root", str(world.root))
        before = json.loads(run(*args, "status", "--json").stdout)
        path = world.node.store.journal.path
        path.unlink()
        path.mkdir()  # reading it would fail
        with pytest.raises(StateFileError, match="history journal"):
            world.node.store.history()
        proc = run(*args, "status", "--json")
        assert proc.returncode == 0, proc.stderr
        after = json.loads(proc.stdout)
        for view in (before, after):  # live readings: the clock and the disk's free space
            view["store"].pop("free_bytes")
        assert {k: v for k, v in after.items() if k not in ("time", "state_seconds")} == \
            {k: v for k, v in before.items() if k not in ("time", "state_seconds")}
        assert after["state_since"] is not None
        st = status(world.node)
        assert st.state_since == before["state_since"] and st.state == "converged"
        names = {f.name for f in collect(world.node)}
        assert "agent_fsm_last_transition_timestamp_seconds" in names
        assert run(*args, "status").returncode == 0


class TestDurability:
    def test_a_line_is_fsynced_before_the_state_that_commits_it(
            self, world: World, monkeypatch: pytest.MonkeyPatch) -> None:
        """Each transition fsyncs its journal line once, before the state file that commits it
        is renamed into place: a committed transition's line survives a power loss."""
        world.installed("1.0.0")
        world.node.controller.fire("settle")  # the journal exists: a plain append
        done: list[tuple[str, str]] = []
        real_fsync, real_replace = os.fsync, os.replace

        def fsync(fd: int) -> None:
            done.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
            real_fsync(fd)

        def replace(src: str, dst: str, **kw: int) -> None:
            done.append(("replace", os.path.basename(dst)))  # a name in the state dir's fd
            real_replace(src, dst, **kw)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)
        line = ("fsync", str(world.node.store.journal.path))
        committed = ("replace", world.paths.state_file.name)
        for _ in range(3):
            done.clear()
            world.node.controller.fire("settle")
            last_commit = max(i for i, op in enumerate(done) if op == committed)
            assert done.count(line) == 1 and done.index(line) < last_commit, done


class TestCrashes:
    def test_a_torn_last_line_is_dropped_then_repaired(self, upgraded: World) -> None:
        """A torn tail (a crash mid-append) is not shown nor reported as damage, and the next
        transition rewrites the journal whole: every line good, each transition once."""
        path = upgraded.node.store.journal.path
        with path.open("ab") as f:  # zeros, as a power loss may leave, then half a line
            f.write(b"\0" * 40 + b"\n" + journal.encode({"seq": 12, "trigger": "settle"})[:25])
        assert _triggers(upgraded) == TRAIL
        assert upgraded.node.store.read_journal().damaged == ()  # a torn tail is no damage
        upgraded.node.controller.fire("settle")
        assert _triggers(upgraded) == [*TRAIL, "settle"]
        assert [journal.decode(line)["seq"] for line in _lines(upgraded)] == list(range(1, 13))

    def test_an_entry_appended_but_not_committed_is_never_shown_nor_doubled(
            self, upgraded: World, monkeypatch: pytest.MonkeyPatch) -> None:
        """Killed after the journal append but before the state write: the entry is beyond
        the state's `seq`, so not shown; the resumed transition records it exactly once."""
        upgraded.add_release("4.0.0")
        real = Store.write

        def crash_after_append(store: Store, doc: StateDoc) -> None:
            if doc.pending is None:
                raise KeyboardInterrupt  # stands for the kill
            real(store, doc)

        monkeypatch.setattr(Store, "write", crash_after_append)
        with pytest.raises(KeyboardInterrupt):
            upgraded.node.controller.fire("begin_upgrade", release="4.0.0")
        monkeypatch.undo()
        assert journal.decode(_lines(upgraded)[-1])["trigger"] == "begin_upgrade"
        back = upgraded.reopen()
        assert _triggers(back) == TRAIL  # not committed: not shown
        back.node.controller.resume()
        assert _triggers(back) == [*TRAIL, "begin_upgrade"]
        assert [journal.decode(line)["seq"] for line in _lines(back)] == list(range(1, 13))


class TestDamage:
    def test_a_damaged_line_is_skipped_reported_and_blocks_nothing(self, upgraded: World) -> None:
        """A damaged line in the middle is skipped by `history`, named (file and line) by
        `doctor`, and the next transitions go on; an entry with a right checksum but a trigger
        that is no name is treated the same."""
        path = upgraded.node.store.journal.path
        lines = _lines(upgraded)
        lines[2] = lines[2].replace(b"begin_upgrade", b"begin_upgradX")  # checksum now wrong
        fourth = journal.decode(lines[3])
        lines[3] = journal.encode({**fourth, "trigger": "Explode!"})[:-1]
        path.write_bytes(b"\n".join(lines) + b"\n")
        assert _triggers(upgraded) == [t for i, t in enumerate(TRAIL) if i not in (2, 3)]
        found = [f for f in doctor(upgraded.node, check_systemd=False) if f.check == "history"]
        assert len(found) == 1 and found[0].level == "warn"
        assert str(path) in found[0].detail and "2 damaged line(s)" in found[0].detail
        assert "line 3 has a wrong checksum" in found[0].detail
        assert "line 4 entry.trigger is 'Explode!'" in found[0].detail
        upgraded.node.controller.fire("settle")
        assert _triggers(upgraded)[-1] == "settle"

    def test_a_symlink_at_the_journal_is_refused(self, world: World, tmp_path: Path) -> None:
        """A symlink planted at the journal's name is refused, naming it; nothing is written
        through it."""
        world.installed("1.0.0")
        path = world.node.store.journal.path
        target = tmp_path / "elsewhere"
        target.write_bytes(b"")
        path.unlink()
        path.symlink_to(target)
        with pytest.raises(StateFileError, match=f"history journal {path} is a symlink"):
            world.node.controller.fire("settle")
        assert target.read_bytes() == b""


class TestRotation:
    def test_the_journal_is_bounded_and_history_keeps_the_last_limit(
            self, tmp_path: Path) -> None:
        """With history_limit 3 the journal never reaches 6 lines, and `history --json` gives
        the last 3 transitions."""
        world = make_world(tmp_path / "root", Config(name="agent", history_limit=3,
                                                     judgment=Judgment(deadline_seconds=60)))
        world.installed("1.0.0")
        sizes = []
        for _ in range(9):
            world.node.controller.fire("settle")
            sizes.append(len(_lines(world)))
        assert max(sizes) == 5 and min(sizes) == 3
        (tmp_path / "config.toml").write_text("history_limit = 3\n" + CONFIG)
        proc = run("--config", str(tmp_path / "config.toml"), "--root", str(world.root),
                   "history", "--json")
        assert [e["trigger"] for e in json.loads(proc.stdout)] == ["settle"] * 3
        assert [journal.decode(line)["seq"] for line in _lines(world)][-1] == 11


    def test_a_damaged_line_dropped_by_a_rotation_is_logged(self, tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
        """When the writer rewrites a journal that has a damaged line in its middle, the line is
        dropped and a warning names the journal, the line and what was wrong with it."""
        world = make_world(tmp_path / "root", DEFAULT_CONFIG._replace(history_limit=20))
        world.installed("1.0.0")
        path = world.node.store.journal.path
        controller = world.node.controller
        lines = path.read_bytes().splitlines()
        lines[0] = lines[0].replace(b"install", b"instalX")  # its checksum now wrong
        path.write_bytes(b"\n".join(lines) + b"\n")

        def told() -> list[str]:
            return [m for r in caplog.records if (m := r.getMessage()).startswith("history")]

        with caplog.at_level(logging.WARNING, logger="agent_fsm"):
            while not told() and len(path.read_bytes().splitlines()) < 40:
                controller.fire("settle")
        assert told() == [
            f"history journal {path}: dropped 1 damaged line(s) (line 1: has a wrong checksum "
            "(damaged or torn)) while rewriting it"]
        assert b"instalX" not in path.read_bytes()

class TestOlderLayouts:
    def test_a_state_file_with_its_history_inside_is_refused_and_left_as_it_is(
            self, upgraded: World) -> None:
        """A schema 1 state file (the history inside it, no journal; no release wrote one) is
        refused in one line by the reader and by a transition, and keeps its bytes."""
        store = upgraded.node.store
        data = json.loads(store.path.read_bytes())
        for key in ("checksum", "kind", "seq", "since", "last_transition", "skipped"):
            data.pop(key)
        data["schema"] = 1
        data["history"] = store.history()
        raw = KIND._replace(schema=1).encode({k: v for k, v in data.items() if k != "schema"})
        store.path.write_bytes(raw)
        with pytest.raises(StateFileError) as err:
            store.read()
        assert "has schema 1, expected 2" in str(err.value) and "\n" not in str(err.value)
        with pytest.raises(StateFileError, match="left untouched"):
            upgraded.node.controller.fire("settle")
        assert store.path.read_bytes() == raw
