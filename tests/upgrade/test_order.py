"""What operators and systemd rely on, transition by transition: what may be triggered in each
state, and the order of the effects that touch systemd and the gate."""

from __future__ import annotations

import pytest

from agent_fsm.errors import Refused, ReleaseError
from agent_fsm.node.runtime import signal
from tests.helpers import Crash, World, crash_at
from tests.machine.test_machine import _to

# What `status` lists as allowed in each state (docs/operations.md, "States"): the operator's
# contract, pinned here so that a transition added by mistake to a state is caught.
ALLOWED = {
    "idle": {"install", "orphaned_signal"},
    "converged": {"install", "activate", "begin_upgrade", "abandon_upgrade", "orphaned_signal",
                  "settle"},
    "candidate_running": {"candidate_started", "judge_ok", "judge_failed", "recover"},
    "judged_ok": {"complete", "complete_queued"},
    "judged_failed": {"recover"},
    "recovering": {"recover", "recovered"},
}


class TestWhatEachStateAllows:
    @pytest.mark.parametrize("state", sorted(ALLOWED))
    def test_allowed_triggers(self, world: World, state: str) -> None:
        """Each state allows exactly its documented triggers: no candidate start after a
        failed judgment, no judgment without a candidate, no `activate` before an install."""
        _to(state)(world)
        assert set(world.node.controller.allowed(world.node.store.read().state)) == ALLOWED[state]


class TestOrder:
    def _observe(self, world: World) -> list[tuple[str, bool]]:
        """(systemctl verb, gate open?) for each call, as systemd would see them."""
        seen: list[tuple[str, bool]] = []
        world.systemd.on_call = lambda verb, _unit: seen.append((verb, world.node.gate.is_open()))
        return seen

    def test_begin_upgrade_closes_the_gate_and_resets_the_start_limit_before_restarting(
            self, world: World) -> None:
        """The gate is closed before the candidate starts, and the start-limit count is reset
        before the restart (else a sixth start within the interval fails); whether the recovery
        unit is at work is asked first, before anything changed (the gate still open); the
        last-good's units, rendered with the current settings, are reloaded before the restart."""
        world.installed("1.0.0")
        world.add_release("2.0.0")
        seen = self._observe(world)
        world.node.controller.fire("begin_upgrade", release="2.0.0")
        assert seen == [("show", True), ("show", False), ("daemon-reload", False),
                        ("reset-failed", False), ("restart", False)]
        assert not world.node.gate.is_open()

    @pytest.mark.parametrize("trigger", ["activate", "install"])
    def test_reload_comes_before_the_restart(self, world: World, trigger: str) -> None:
        """Written units are loaded (daemon-reload) before the agent restarts through them."""
        world.installed("1.0.0")
        world.add_release("2.0.0")
        seen = self._observe(world)
        world.node.controller.fire(trigger, release="2.0.0")
        verbs = [v for v, _ in seen]
        assert verbs.index("daemon-reload") < verbs.index("restart")

    @pytest.mark.parametrize("path", ["complete", "recovered", "settle"])
    def test_the_gate_opens_only_after_systemd_is_reloaded(self, world: World,
                                                           path: str) -> None:
        """No operation can start (the gate is shut) until systemd has loaded the assets."""
        world.installed("1.0.0")
        if path == "settle":
            world.node.gate.close()  # as at every start of the agent: its run dir is new
        else:
            world.upgrading("2.0.0")
            world.node.controller.fire("judge_ok" if path == "complete" else "recover")
        seen = self._observe(world)
        world.node.controller.fire(path)
        assert ("daemon-reload", False) in seen and world.node.gate.is_open()

    @pytest.mark.parametrize("trigger", ["install", "activate", "begin_upgrade"])
    def test_a_missing_release_changes_nothing(self, world: World, trigger: str) -> None:
        """Installing, activating or upgrading to a release that is not stored is refused
        before anything is recorded or touched: no owed transition is left to fail at every
        start."""
        world.installed("1.0.0")
        before = world.paths.state_file.read_bytes()
        with pytest.raises(ReleaseError, match="not on this host"):
            world.node.controller.fire(trigger, release="9.9.9")
        assert world.paths.state_file.read_bytes() == before and world.node.gate.is_open()


class TestInvariantsAtEveryStep:
    @pytest.mark.parametrize("trigger", ["install", "activate"])
    def test_the_gate_is_shut_whenever_the_selection_moves(self, world: World,
                                                           trigger: str) -> None:
        """Crashed after any effect of install or activate: if the selected release is no
        longer the one that was running, the gate is already shut (no operation may start
        on a node switching releases)."""
        world.installed("1.0.0")
        world.add_release("2.0.0")
        effects = world.node.definition.transition(trigger).effects
        for k in range(1, len(effects) + 1):
            node = world.reopen().node
            node.controller.failpoint = crash_at(trigger, k)
            with pytest.raises(Crash):
                node.controller.fire(trigger, release="2.0.0")
            if node.releases.selected() != "1.0.0":
                assert not node.gate.is_open(), f"gate open after effect {k} of {trigger}"
            world.reopen().node.controller.resume()
            world.node.controller.fire("activate", release="1.0.0")
            world.node.controller.fire("settle")

    def test_the_gate_is_shut_whenever_a_signal_exists(self, world: World) -> None:
        """Crashed after any effect of begin_upgrade: once the signal exists, the gate is
        already shut (no operation may start while an upgrade is pending)."""
        world.installed("1.0.0")
        world.add_release("2.0.0")
        for k in range(1, len(world.node.definition.transition("begin_upgrade").effects) + 1):
            node = world.reopen().node
            node.controller.failpoint = crash_at("begin_upgrade", k)
            with pytest.raises(Crash):
                # forced: each round rolls 2.0.0 back, which marks it known bad
                node.controller.fire("begin_upgrade", release="2.0.0", force=True)
            if node.signal() is not None:
                assert not node.gate.is_open(), f"gate open with a signal after effect {k}"
            world.reopen().node.controller.resume()
            for trigger in ("candidate_started", "recover", "recovered"):
                world.node.controller.fire(trigger)

    @pytest.mark.parametrize("path", ["install", "activate", "complete", "recovered", "settle"])
    def test_systemd_reloads_the_assets_as_written(self, world: World, path: str) -> None:
        """When systemd is told to reload, the assets on disk are already the ones this
        transition writes: it never loads stale units."""
        world.installed("1.0.0")
        args: dict[str, str] = {}
        if path == "settle":
            expected = "1.0.0"
            world.paths.agent_unit.write_text("# drifted\n")  # settle converges it back
        elif path in ("install", "activate"):
            world.add_release("2.0.0")
            args = {"release": "2.0.0"}
            expected = "2.0.0"
        else:
            world.upgrading("2.0.0")
            world.node.controller.fire("judge_ok" if path == "complete" else "recover")
            expected = "2.0.0" if path == "complete" else "1.0.0"
            world.paths.recovery_unit.unlink()  # damage the way out repairs, before its reload
        at_reload: list[dict[str, bytes | None]] = []
        world.systemd.on_call = lambda verb, _u: at_reload.append(world.assets_on_disk()) \
            if verb == "daemon-reload" else None
        world.node.controller.fire(path, **args)
        assert at_reload and at_reload[0] == world.rendered(expected)

    @pytest.mark.parametrize("trigger", ["install", "activate", "begin_upgrade"])
    def test_nothing_starts_over_a_signal(self, world: World, trigger: str) -> None:
        """An install, activation or upgrade on a node with an upgrade signal (even one the
        state file does not know) is refused: the way out is `recover`; nothing is selected,
        promoted or signalled anew."""
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world.add_release("3.0.0")
        now = world.clock.now()
        orphan = signal.UpgradeSignal("1.0.0", "2.0.0", 1, now, now + 60)
        signal.write(world.paths.signal_file, orphan)
        with pytest.raises(Refused, match="is pending"):
            world.node.controller.fire(trigger, release="3.0.0")
        assert world.node.releases.selected() == world.node.releases.last_good() == "1.0.0"
        assert world.node.signal() == orphan




class TestSettleNeedsNoSignal:
    def test_settle_is_refused_while_a_signal_exists(self, world: World) -> None:
        """A start that would converge the assets is refused while a signal exists: the held
        assets are the way back and are never converged to the selected release."""
        world.installed("1.0.0")
        now = world.clock.now()
        signal.write(world.paths.signal_file,
                     signal.UpgradeSignal("1.0.0", "2.0.0", 1, now, now + 60))
        before = world.assets_on_disk()
        with pytest.raises(Refused, match="is pending"):
            world.node.controller.fire("settle")
        assert world.assets_on_disk() == before


class TestRecoveredNeedsTheLastGood:
    def test_recovered_is_refused_while_the_candidate_is_selected(self, world: World) -> None:
        """The way back ends only on the last-good: with the candidate still selected,
        `recovered` is refused (exit 3) and the signal and the shut gate stay."""
        world.installed("1.0.0")
        world.upgrading("2.0.0")
        world.node.controller.fire("recover")
        world.node.releases.select("2.0.0")  # as a hand-made switch would leave it
        with pytest.raises(Refused, match="recovery is not finished"):
            world.node.controller.fire("recovered")
        assert world.node.signal() is not None and not world.node.gate.is_open()
