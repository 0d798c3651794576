"""An effect allowed to fail (a refused `reset-failed`) never stops the way back, and the
operator sees it: in the history, in `status` and in `doctor`."""

from __future__ import annotations

import json

from agent_fsm.views.doctor.checks import doctor
from agent_fsm.views.status.report import status
from tests.helpers import World


class TestSkippedEffects:
    def test_refused_reset_failed_lets_the_upgrade_and_the_rollback_go_on(
            self, world: World) -> None:
        """With `systemctl reset-failed` refused, begin_upgrade still restarts into the
        candidate and recover still restarts the last-good; each refusal is recorded."""
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world.systemd.fail.add("reset-failed")
        world.node.controller.fire("begin_upgrade", release="2.0.0")
        assert world.node.releases.selected() == "2.0.0"
        world.node.controller.fire("candidate_started")
        world.node.controller.fire("recover")
        assert world.node.releases.selected() == "1.0.0"
        assert [v for v, _u in world.systemd.calls].count("restart") >= 2
        doc = world.node.store.read()
        skipped = [(e["trigger"], s["effect"])
                   for e in world.node.store.history(doc) for s in e.get("skipped", [])]
        assert skipped == [("begin_upgrade", "reset_start_limit"), ("recover", "reset_start_limit")]

    def test_status_and_doctor_show_what_was_let_pass(self, world: World) -> None:
        """`status --json` lists the skipped effects of the current cycle with the error, and
        `doctor` warns with the command to run; a new upgrade starts a clean slate."""
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world.systemd.fail.add("reset-failed")
        world.node.controller.fire("begin_upgrade", release="2.0.0")
        data = json.loads(json.dumps(status(world.node).to_json()))
        assert [(s["trigger"], s["effect"]) for s in data["skipped"]] == [
            ("begin_upgrade", "reset_start_limit")]
        assert "injected failure" in data["skipped"][0]["error"]
        warn = [f for f in doctor(world.node, check_systemd=False) if f.check == "skipped effect"]
        assert len(warn) == 1 and warn[0].level == "warn"
        assert "systemctl reset-failed agent.service" in warn[0].fix
        world.systemd.fail.clear()
        for trigger in ("candidate_started", "judge_ok", "complete"):
            world.node.controller.fire(trigger)
        world.add_release("3.0.0")
        world.node.controller.fire("begin_upgrade", release="3.0.0")
        assert status(world.node).skipped == ()
