"""The machine as data, run: every declared transition, every illegal trigger, every refusal."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agent_fsm.errors import IllegalTransition, Refused, ReleaseError
from agent_fsm.machine.vocabulary import COMMANDS
from agent_fsm.node.runtime import signal
from agent_fsm.upgrade.registry import load_definition
from tests.helpers import World

DEFINITION = load_definition()


def _to(state: str) -> Callable[[World], None]:
    """Drive a fresh world into `state` through real transitions."""

    def drive(world: World) -> None:
        c = world.node.controller
        if state == "idle":
            world.add_release("1.0.0")
            return
        world.installed("1.0.0")
        if state == "converged":
            return
        world.upgrading("2.0.0")
        if state == "candidate_running":
            return
        if state == "judged_ok":
            c.fire("judge_ok")
        elif state == "judged_failed":
            c.fire("judge_failed")
        elif state == "recovering":
            c.fire("recover")

    return drive


def _args(trigger: str, world: World) -> dict[str, str]:
    if trigger == "orphaned_signal" and world.node.signal() is None:  # as from a restored backup
        releases = world.node.releases
        if releases.last_good() is None:
            releases.select("1.0.0")
            releases.promote("1.0.0")
        world.add_release("2.0.0")
        now = world.clock.now()
        signal.write(world.paths.signal_file, signal.UpgradeSignal("1.0.0", "2.0.0", 1, now,
                                                                     now + 60))
        releases.select("2.0.0")
        return {}
    if trigger == "abandon_upgrade":  # `recover` names the last-good to select again
        return {"release": str(world.node.releases.last_good())}
    if trigger in ("install", "activate", "begin_upgrade"):
        world.add_release("3.0.0")
        return {"release": "3.0.0"}
    return {}


EDGES = [(t.trigger, s, t.dest) for t in DEFINITION.transitions for s in t.sources]
ILLEGAL = [(trig, s) for s in DEFINITION.state_names
           for trig in sorted({t.trigger for t in DEFINITION.transitions})
           if trig not in DEFINITION.triggers_from(s)]


class TestTable:
    @pytest.mark.parametrize(("trigger", "source", "dest"), EDGES,
                             ids=[f"{t}:{s}->{d}" for t, s, d in EDGES])
    def test_every_transition_reaches_its_destination(self, world: World, trigger: str,
                                                      source: str, dest: str) -> None:
        """Each declared transition, fired from each of its sources, lands in its destination
        and is recorded in the history."""
        _to(source)(world)
        assert world.node.store.read().state == source
        doc = world.node.controller.fire(trigger, **_args(trigger, world))
        assert doc.state == dest
        again = world.reopen().node.store.read()
        assert again.state == dest and again.pending is None
        last = world.node.store.history(again)[-1]
        assert (last["trigger"], last["from"], last["to"]) == (trigger, source, dest)

    @pytest.mark.parametrize(("trigger", "state"), ILLEGAL, ids=[f"{t}@{s}" for t, s in ILLEGAL])
    def test_every_illegal_trigger_is_refused_and_changes_nothing(self, world: World,
                                                                 trigger: str, state: str) -> None:
        """A trigger with no transition from the current state is refused (exit 3) and the state
        file is left byte for byte."""
        _to(state)(world)
        before = world.paths.state_file.read_bytes() if world.paths.state_file.exists() else None
        with pytest.raises(IllegalTransition) as err:
            world.node.controller.fire(trigger, **_args(trigger, world))
        assert err.value.exit_code == 3
        command = COMMANDS.get(trigger)  # a user's command is named as the user typed it
        assert str(err.value).startswith(f"can't {command} now: " if command
                                         else f"can't {trigger} while {state}: ")
        after = world.paths.state_file.read_bytes() if world.paths.state_file.exists() else None
        assert after == before

    def test_illegal_message_says_what_is_going_on(self, world: World) -> None:
        """The refusal of a user's command names the command, the upgrade being judged and
        the commands that may run now, never a trigger's name."""
        world.installed("1.0.0")
        world.upgrading("2.1.0")
        with pytest.raises(IllegalTransition) as err:
            world.node.controller.fire("install", release="2.1.0")
        assert str(err.value) == ("can't install now: an upgrade to 2.1.0 is being judged "
                                  "(you can run `agent-fsm recover`)")
        with pytest.raises(IllegalTransition) as err:
            world.node.controller.fire("begin_upgrade", release="2.1.0")
        assert str(err.value) == ("can't upgrade now: an upgrade to 2.1.0 is being judged "
                                  "(you can run `agent-fsm recover`)")

    def test_a_refusal_in_idle_names_install(self, world: World) -> None:
        """`upgrade` on a node with nothing installed says `upgrade` and that `install` may run,
        not `begin_upgrade` nor the daemon's `orphaned_signal`."""
        with pytest.raises(IllegalTransition) as err:
            world.node.controller.fire("begin_upgrade", release="2.1.0")
        assert str(err.value) == ("can't upgrade now: nothing is installed yet; run `agent-fsm "
                                  "install --version V` (you can run `agent-fsm install`)")

    def test_a_daemon_trigger_keeps_its_name(self, world: World) -> None:
        """A refused trigger no command fires (the daemon's) still names it and the triggers
        allowed, for the journal's reader."""
        world.installed("1.0.0")
        with pytest.raises(IllegalTransition, match=r"^can't judge_ok while converged: .*"
                                                    r"\(allowed now: "):
            world.node.controller.fire("judge_ok")


class TestConditions:
    def test_upgrade_refused_while_gate_closed(self, world: World) -> None:
        """An upgrade before the daemon has opened the gate is refused with the reason."""
        world.add_release("1.0.0")
        world.node.controller.fire("install", release="1.0.0")
        world.add_release("2.0.0")
        with pytest.raises(Refused, match=r"startup gate .* is closed") as err:
            world.node.controller.fire("begin_upgrade", release="2.0.0")
        assert err.value.exit_code == 3
        assert world.node.effectors.releases.selected() == "1.0.0"

    def test_upgrade_to_unknown_release_is_an_error(self, world: World) -> None:
        """Upgrading to a version that is not on the host names it and the known ones."""
        world.installed("1.0.0")
        with pytest.raises(ReleaseError, match=r"release 9\.9 is not on this host.*known releases: 1\.0\.0"):
            world.node.controller.fire("begin_upgrade", release="9.9")
        assert world.node.store.read().state == "converged"

    def test_activate_refused_while_upgrade_pending(self, world: World) -> None:
        """A pending upgrade's signal refuses a direct activation from a converged state file."""
        world.installed("1.0.0")
        world.add_release("2.0.0")
        signal.write(world.paths.signal_file, signal.UpgradeSignal("1.0.0", "2.0.0", 1, 0.0, 0.0))
        with pytest.raises(Refused, match=r"an upgrade from 1\.0\.0 to 2\.0\.0 is pending"):
            world.node.controller.fire("activate", release="2.0.0")

    def test_upgrade_to_selected_release_is_refused(self, world: World) -> None:
        """Upgrading to the release already running is refused: there is nothing to judge."""
        world.installed("1.0.0")
        with pytest.raises(Refused, match="already selected"):
            world.node.controller.fire("begin_upgrade", release="1.0.0")

    def test_attempts_are_counted_per_candidate_start(self, world: World) -> None:
        """Each start of the candidate counts one attempt in the signal, even after a resume."""
        world.installed("1.0.0")
        world.upgrading("2.0.0")
        assert world.node.effectors.signal().attempt == 1  # type: ignore[union-attr]
        world.node.controller.fire("candidate_started")
        world.node.controller.resume()
        assert world.node.effectors.signal().attempt == 2  # type: ignore[union-attr]
