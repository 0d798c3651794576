"""Recovery preempts: `recover` replaces an owed transition of the candidate's path instead of
finishing it, as `supersedes` in states/agent-upgrade.toml declares."""

from __future__ import annotations

import pytest

from agent_fsm.actions.recover import recover
from agent_fsm.errors import AssetError, DefinitionError, DiskError
from agent_fsm.machine.definition import default_text
from agent_fsm.machine.engine import env_failpoint
from agent_fsm.node.records import known_bad
from agent_fsm.node.state.store import StateDoc
from agent_fsm.upgrade.registry import load_definition
from agent_fsm.upgrade.way_back import abandon_cut_upgrade
from tests.helpers import Crash, World, crash_at

BROKEN_UNIT = "[Service]\nExecStart=/nonexistent\n"




class TestSupersede:
    def test_recover_replaces_a_candidate_start_that_cannot_finish(self, world: World) -> None:
        """A candidate whose start is owed and can never finish (holding fails every time) does
        not strand the node: `recover` supersedes it, rolls back, and the history says so."""
        world.installed("1.0.0")
        world.add_release("2.0.0", agent_unit=BROKEN_UNIT)
        world.node.controller.fire("begin_upgrade", release="2.0.0")
        world.paths.recovery_script.unlink()  # holding must restore it ...
        world.paths.last_good_assets.unlink()
        world.node.controller.failpoint = crash_at("candidate_started", 1)
        with pytest.raises(Crash):
            world.node.controller.fire("candidate_started")
        world.node.controller.failpoint = env_failpoint
        for version in ("1.0.0",):  # ... and cannot: neither the kept copy nor the release
            (world.paths.releases_dir / version / "assets" / "recovery.sh").unlink()
            # As if it had been stored so: a release changed since it was added would be
            # refused at select (test_release_store).
            world.record_digest(version)
        with pytest.raises(AssetError, match="recovery"):
            world.reopen().node.controller.resume()
        done = recover(world.node)
        doc = world.node.store.read()
        assert done.state == "recovering" and doc.pending is None
        assert world.node.releases.selected() == "1.0.0"
        superseded = [e for e in world.node.store.history(doc) if e.get("superseded_by")]
        assert [(e["trigger"], e["superseded_by"]) for e in superseded] == [
            ("candidate_started", "recover")]
        assert ("restart", "agent.service") in world.systemd.calls

    def test_recover_replaces_an_interrupted_judge_failed(self, world: World) -> None:
        """A judge_failed interrupted after recording its result is replaced by `recover`: the
        result is recorded once and the recovery unit is not started on top of the rollback."""
        world.installed("1.0.0")
        world.upgrading("2.0.0")
        world.node.controller.failpoint = crash_at("judge_failed", 1)
        with pytest.raises(Crash):
            world.node.controller.fire("judge_failed")
        world.node.controller.failpoint = env_failpoint
        world.systemd.calls.clear()
        recover(world.node)
        doc = world.node.store.read()
        assert doc.state == "recovering"
        assert ("start", "agent-recovery.service") not in world.systemd.calls
        assert [r.outcome for r in world.publisher.recorded] == ["rolled_back"]

    @pytest.mark.parametrize("cut", range(6))  # after the write-ahead, before each effect
    def test_recover_abandons_an_upgrade_cut_before_its_candidate_started(
            self, world: World, cut: int) -> None:
        """An `upgrade` cut by a power loss after its write-ahead is abandoned by `recover`, not
        finished then rolled back: the last-good selected, no signal, 2.0.0 not known bad, and
        the last-good's start opens the gate."""
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world.node.controller.failpoint = crash_at("begin_upgrade", cut)
        with pytest.raises(Crash):
            world.node.controller.fire("begin_upgrade", release="2.0.0")
        world = world.reopen()
        done = recover(world.node)
        doc = world.node.store.read()
        assert (done.state, doc.pending, doc.upgrade) == ("converged", None, None)
        assert "abandoned before its candidate started" in done.message
        assert world.node.releases.selected() == "1.0.0" == world.node.releases.last_good()
        assert world.node.signal() is None
        assert known_bad.read(world.paths.known_bad_file).marks == {}
        assert world.publisher.recorded == []
        history = world.node.store.history(doc)
        assert [(e["trigger"], e.get("superseded_by")) for e in history[-2:]] == [
            ("begin_upgrade", "abandon_upgrade"), ("abandon_upgrade", None)]
        assert ("restart", "agent.service") in world.systemd.calls
        assert world.assets_on_disk() == world.rendered("1.0.0")
        world.node.controller.fire("settle")  # the last-good's start
        assert world.node.gate.is_open()
        assert world.node.store.read().state == "converged"

    @pytest.mark.parametrize("cut", range(6))  # before each effect, and before its record
    def test_a_recover_killed_inside_the_abandonment_never_leaves_the_candidate_unsignalled(
            self, world: World, cut: int) -> None:
        """An `upgrade` cut after selecting its candidate, then `recover` killed at each point of
        its abandonment: at every point the selected release is the last-good or the candidate a
        signal names (a start in between never runs 2.0.0 unjudged, its starts uncounted), and
        the next `recover` ends the abandonment on the last-good."""
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world.node.controller.failpoint = crash_at("begin_upgrade", 3)  # signal, 2.0.0 selected
        with pytest.raises(Crash):
            world.node.controller.fire("begin_upgrade", release="2.0.0")
        world = world.reopen()
        world.node.controller.failpoint = crash_at("abandon_upgrade", cut)
        with pytest.raises(Crash):
            recover(world.node)
        world = world.reopen()
        selected, sig = world.node.releases.selected(), world.node.signal()
        assert selected == "1.0.0" or (sig is not None and sig.to_version == selected), \
            (selected, sig)
        assert recover(world.node).state == "converged"
        assert world.node.releases.selected() == "1.0.0" and world.node.signal() is None
        assert known_bad.read(world.paths.known_bad_file).marks == {}

    def test_a_full_disk_during_the_abandonment_never_orphans_the_signal(
            self, world: World, monkeypatch: pytest.MonkeyPatch) -> None:
        """A full disk at the second state-file write of `recover`'s abandonment leaves either
        upgrade owed (the supersession is written with abandon_upgrade's write-ahead, never
        alone), so the next `recover` ends it: the signal is never taken for an orphan and
        2.0.0 never marked."""
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world.node.controller.failpoint = crash_at("begin_upgrade", 3)  # signal written
        with pytest.raises(Crash):
            world.node.controller.fire("begin_upgrade", release="2.0.0")
        world = world.reopen()

        store = world.node.store
        write, writes = store.write, []

        def full_at_the_second(doc: StateDoc) -> None:
            writes.append(doc)
            if len(writes) == 2:
                raise DiskError(f"could not write {store.path}: No space left on device")
            write(doc)

        with monkeypatch.context() as m:
            m.setattr(store, "write", full_at_the_second)
            with pytest.raises(DiskError):
                recover(world.node)
        assert world.reopen().node.store.read().pending is not None  # one of them owed
        assert recover(world.reopen().node).state == "converged"
        assert world.node.signal() is None
        assert known_bad.read(world.paths.known_bad_file).marks == {}

    def test_an_upgrade_only_in_flight_when_read_is_not_abandoned(self, world: World) -> None:
        """An upgrade owed when `recover` read the state unlocked but finished before it took
        the lock (running, not cut) is left alone: no abandonment, the candidate still pending."""
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world.node.controller.failpoint = crash_at("begin_upgrade", 2)
        with pytest.raises(Crash):
            world.node.controller.fire("begin_upgrade", release="2.0.0")
        world = world.reopen()
        read = world.node.store.read()  # as `recover` read it
        world.node.controller.resume()  # the operator's upgrade goes on meanwhile
        assert abandon_cut_upgrade(world.node, read, restart=True) is None
        doc = world.node.store.read()
        assert (doc.state, doc.pending) == ("candidate_running", None)
        assert world.node.releases.selected() == "2.0.0"

    def test_other_owed_transitions_are_resumed_not_superseded(self, world: World) -> None:
        """What `recover` does not declare it supersedes (an interrupted install) is finished
        first, as always."""
        world.add_release("1.0.0")
        world.node.controller.failpoint = crash_at("install", 3)
        with pytest.raises(Crash):
            world.node.controller.fire("install", release="1.0.0")
        world.node.controller.failpoint = env_failpoint
        done = recover(world.node)
        doc = world.node.store.read()
        assert done.message.startswith("nothing to roll back") and doc.state == "converged"
        assert not any(e.get("superseded_by") for e in world.node.store.history(doc))

    def test_superseding_an_unknown_trigger_is_refused_at_load(self) -> None:
        """A definition naming an unknown trigger under `supersedes` fails to load, naming it."""
        text, _ = default_text()
        text = text.replace('supersedes = ["candidate_started", "judge_failed"]',
                            'supersedes = ["candidate_startd"]')
        with pytest.raises(DefinitionError, match=r"supersedes unknown trigger.*candidate_startd"):
            load_definition(text, "typo.toml")
