"""A signal without an upgrade in the state file (a restored backup, a lost file), or one that
cannot be read, has a way out: roll back to the last-good; the unjudged candidate is never
accepted."""

from __future__ import annotations

import pytest

from agent_fsm.actions.recover import recover
from agent_fsm.agent.daemon import Daemon, Waker
from agent_fsm.errors import Refused
from agent_fsm.node.records import known_bad
from agent_fsm.system.notify import Notifier
from agent_fsm.views.doctor.checks import doctor
from agent_fsm.views.status.report import status
from tests.helpers import World


def _restored_mid_judgment(world: World) -> dict[str, bytes | None]:
    """Converged on 1.0.0, then an upgrade to 2.0.0 is judged while state.json is restored
    from a backup taken before it; returns the last-good's assets."""
    world.installed("1.0.0")
    before = world.assets_on_disk()
    backup = world.paths.state_file.read_bytes()
    world.upgrading("2.0.0")
    world.paths.state_file.write_bytes(backup)
    return before


class TestOrphanedSignal:
    def test_the_daemon_rolls_back_instead_of_holding_forever(self, world: World,
                                                              waker: Waker) -> None:
        """The candidate's daemon, finding a signal the state file does not know, rolls back
        to the last-good (selects it and queues a restart) instead of failing every start."""
        before = _restored_mid_judgment(world)
        world.systemd.calls.clear()
        waker.stop = True  # the restart it queues stops it
        assert Daemon(world.node, Notifier(""), waker).startup()
        doc = world.node.store.read()
        assert doc.state == "recovering" and doc.upgrade is not None
        assert world.node.releases.selected() == "1.0.0"
        assert world.systemd.calls == [("reset-failed", "agent.service"),
                                       ("restart", "agent.service")]
        assert doc.last_result is not None and doc.last_result["outcome"] == "rolled_back"
        assert world.node.store.history(doc)[-1]["trigger"] == "orphaned_signal"
        assert world.node.store.history(doc)[-1]["upgrade"] == {"from": "1.0.0", "to": "2.0.0"}
        world.node.controller.fire("recovered")
        assert world.node.store.read().state == "converged"
        assert world.node.releases.last_good() == "1.0.0" and world.node.signal() is None
        assert world.assets_on_disk() == before

    def test_the_candidate_it_rolls_back_is_not_marked_known_bad(self, world: World,
                                                                 waker: Waker) -> None:
        """The candidate an orphaned signal rolls back was never judged here: it is not marked
        known bad (the next `upgrade --to` it is judged again, not refused), and the result
        recorded says why it rolled back (`orphaned`)."""
        _restored_mid_judgment(world)
        waker.stop = True
        assert Daemon(world.node, Notifier(""), waker).startup()
        assert known_bad.view(world.paths) == ((), None)
        result = world.node.store.read().last_result
        assert result is not None and result["outcome"] == "rolled_back"
        assert result["reason_class"] == "orphaned" and result["reason"] != ""
        world.node.controller.fire("recovered")
        assert known_bad.refusal(world.paths.known_bad_file, "2.0.0") is None
        assert world.node.controller.fire("begin_upgrade", release="2.0.0").state \
            == "candidate_running"

    def test_a_recover_during_that_rollback_marks_nothing_either(self, world: World,
                                                                  waker: Waker) -> None:
        """A `recover` that finds an orphaned signal's rollback under way (the recovery unit
        after the last-good's start failed, or an operator) finishes it and marks nothing:
        the candidate was still never judged here."""
        _restored_mid_judgment(world)
        waker.stop = True
        assert Daemon(world.node, Notifier(""), waker).startup()
        assert recover(world.node).state == "recovering"
        assert known_bad.view(world.paths) == ((), None)
        assert world.node.releases.selected() == "1.0.0"

    def test_the_gate_is_shut_on_the_way_back(self, world: World) -> None:
        """On a node whose gate is open (the candidate runs as if settled), rolling back an
        orphaned signal shuts the gate until the last-good's start opens it."""
        _restored_mid_judgment(world)
        world.node.gate.open()
        recover(world.node)
        assert not world.node.gate.is_open()
        world.node.controller.fire("recovered")
        assert world.node.gate.is_open()

    def test_no_signal_no_orphan(self, world: World) -> None:
        """Without a signal there is nothing to roll back: the transition is refused and
        nothing is recorded or owed."""
        world.installed("1.0.0")
        before = world.paths.state_file.read_bytes()
        with pytest.raises(Refused, match="no upgrade signal"):
            world.node.controller.fire("orphaned_signal")
        assert world.paths.state_file.read_bytes() == before and world.node.gate.is_open()

    def test_recover_with_no_state_file_rolls_back(self, world: World) -> None:
        """With the state file lost (idle) and a signal, `recover` rolls back to the
        last-good rather than saying there is nothing to do."""
        _restored_mid_judgment(world)
        world.paths.state_file.unlink()
        done = recover(world.node)
        assert done.state == "recovering" and "never judged" in done.message
        assert world.node.releases.selected() == "1.0.0"

    def test_the_candidate_is_never_promoted(self, world: World, waker: Waker) -> None:
        """Whatever runs next, the last-good stays the last-good: no transition out of the
        orphaned signal accepts the candidate."""
        _restored_mid_judgment(world)
        assert not world.node.controller.allowed("converged").count("complete")
        recover(world.node)
        world.node.controller.fire("recovered")
        assert world.node.releases.last_good() == "1.0.0"
        assert all(e["trigger"] != "complete" for e in world.node.store.history()[-3:])

    def test_doctor_and_status_advise_recover_not_removing_the_signal(self,
                                                                      world: World) -> None:
        """`doctor` and `status` name `agent-fsm recover` as the way out, never removing the
        signal by hand (which would let the next start accept the unjudged candidate)."""
        _restored_mid_judgment(world)
        finding = next(f for f in doctor(world.node, check_systemd=False) if f.check == "signal")
        assert finding.level == "fail" and "agent-fsm recover" in finding.fix
        assert "remove" not in finding.fix.replace("never remove", "")
        nxt = status(world.node).next
        assert nxt.commands == ("agent-fsm recover",) and "never judged" in nxt.summary


class TestDamagedSignal:
    def test_recover_does_not_need_a_readable_signal(self, world: World) -> None:
        """With the signal damaged mid-judgment, `recover` still rolls back and the last-good's
        start clears the damaged signal."""
        world.installed("1.0.0")
        world.upgrading("2.0.0")
        world.paths.signal_file.write_text("{not json")
        assert recover(world.node).state == "recovering"
        assert world.node.releases.selected() == "1.0.0"
        world.node.controller.fire("recovered")
        assert world.node.store.read().state == "converged" and world.node.signal() is None
        assert world.node.releases.last_good() == "1.0.0"

    def test_doctor_gives_a_safe_way_out_by_state(self, world: World) -> None:
        """`doctor` advises `recover` while an upgrade is pending, and moving the signal aside
        only when the node already runs its last-good."""
        world.installed("1.0.0")
        world.upgrading("2.0.0")
        world.paths.signal_file.write_text("{not json")

        def fix() -> str:
            return next(f.fix for f in doctor(world.node, check_systemd=False)
                        if f.check == "signal")

        assert fix().startswith("roll back with `agent-fsm recover`")
        recover(world.node)
        world.node.controller.fire("recovered")
        world.paths.signal_file.write_text("{not json")  # damaged again, on the last-good
        assert "runs its last-good 1.0.0: move the signal aside" in fix()
