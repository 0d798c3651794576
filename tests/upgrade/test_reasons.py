"""Reasons: every result says why, in words and as a class (a failed check with its last line, a
crash at start with its exit status and starts, a deadline, a stop, a manual recover), and
`status`, `history`, the published JSON and `metrics` carry it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_fsm.actions.recover import recover
from agent_fsm.agent import judge as judge_mod
from agent_fsm.agent.daemon import Daemon, Waker
from agent_fsm.node.config import Config, Judgment
from agent_fsm.node.state import reasons, validate
from agent_fsm.system.notify import Notifier
from agent_fsm.system.publish import RecordPublisher, Result
from agent_fsm.testing import FakeClock
from agent_fsm.views.history import history
from agent_fsm.views.metrics import collect, exposition
from agent_fsm.views.status.report import status
from tests.helpers import World, make_world


def _world(tmp_path: Path, checks: tuple[tuple[str, ...], ...]) -> World:
    config = Config(name="agent", judgment=Judgment(deadline_seconds=1, soak_seconds=0,
                                                    max_attempts=2, checks=checks))
    return make_world(tmp_path / "root", config)


def last(world: World) -> dict[str, object]:
    result = status(world.node).to_json()["last_result"]
    assert result is not None
    return result  # type: ignore[no-any-return]


class TestJudgedFailed:
    def test_a_failed_check_is_check_failed_with_its_last_output_line(
            self, tmp_path: Path, waker: Waker) -> None:
        """A check failing at the deadline: `check_failed`, naming the check and its last line."""
        script = tmp_path / "probe"
        script.write_text("#!/bin/sh\necho starting\necho 'db: connection refused' >&2\nexit 7\n")
        script.chmod(0o755)
        world = _world(tmp_path, ((str(script),),))
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world.node.controller.fire("begin_upgrade", release="2.0.0")
        assert not Daemon(world.node, Notifier(""), waker).startup()
        recover(world.node)  # the recovery unit: the judged reason stays
        r = last(world)
        assert r["reason_class"] == "check_failed" and r["outcome"] == "rolled_back"
        assert 'probe exited 7: "db: connection refused"' in str(r["reason"])

    @pytest.mark.parametrize(("kwargs", "cls"), [
        ({"attempt": 3}, "crashed"),
        ({"stopping": lambda: True}, "stopped"),
        ({"alive": lambda: False}, "crashed"),
        ({"check": lambda argv, timeout: (False, "probe exited 1: down")}, "check_failed"),
    ])
    def test_each_way_a_judgment_fails_has_its_class(self, kwargs: dict[str, object],
                                                     cls: str) -> None:
        """Restarted past max_attempts or the workload gone: crashed; a stop: stopped; a
        failing check: check_failed."""
        clock = FakeClock()
        args: dict[str, object] = {"attempt": 1, "clock": clock,
                                   "check": lambda argv, timeout: (True, "ok")}
        args.update(kwargs)
        verdict = judge_mod.judge(Judgment(deadline_seconds=5, soak_seconds=1, max_attempts=2,
                                           checks=(("probe",),)), **args)  # type: ignore[arg-type]
        assert (verdict.ok, verdict.reason_class) == (False, cls)

    def test_a_judged_ok_result_is_passed(self, tmp_path: Path, waker: Waker) -> None:
        """A candidate judged ok records reason_class `passed`."""
        world = _world(tmp_path, (("true",),))
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world.node.controller.fire("begin_upgrade", release="2.0.0")
        assert Daemon(world.node, Notifier(""), waker).startup()
        assert (last(world)["outcome"], last(world)["reason_class"]) == ("ok", "passed")


class TestRecover:
    def test_an_operator_recover_is_manual(self, world: World) -> None:
        """`agent-fsm recover` run by hand records `manual`."""
        world.installed("1.0.0")
        world.upgrading("2.0.0")
        recover(world.node)
        assert last(world)["reason_class"] == "manual"
        assert ("show", "agent.service") not in world.systemd.calls

    @pytest.mark.parametrize(("shown", "cls", "words"), [
        ({"Result": "exit-code", "ExecMainStatus": "3", "NRestarts": "2"}, "crashed",
         "result exit-code, exit status 3, restarted 2 time(s)"),
        ({"Result": "start-limit-hit", "ExecMainStatus": "1", "NRestarts": "4"}, "crashed",
         "exit status 1, restarted 4 time(s)"),
        ({"Result": "timeout", "ExecMainStatus": "0", "NRestarts": "0"}, "deadline",
         "start timeout"),
    ])
    def test_the_recovery_unit_reads_how_the_agent_unit_failed(
            self, world: World, monkeypatch: pytest.MonkeyPatch, shown: dict[str, str],
            cls: str, words: str) -> None:
        """Run by the recovery unit (its environment says so) for a candidate that never judged
        itself: the agent unit's Result, ExecMainStatus and NRestarts, from systemd."""
        world.systemd.shown = shown
        world.installed("1.0.0")
        world.upgrading("2.0.0")
        recover(world.node, by_unit=True)
        r = last(world)
        assert r["reason_class"] == cls and words in str(r["reason"])

    def test_systemd_unreadable_still_rolls_back(self, world: World,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
        """If `systemctl show` fails, the way back goes on: crashed, saying it could not read."""
        world.systemd.fail.add("show")
        world.installed("1.0.0")
        world.upgrading("2.0.0")
        recover(world.node, by_unit=True)
        assert world.node.effectors.releases.selected() == "1.0.0"
        assert last(world)["reason_class"] == "crashed"
        assert "could not be read" in str(last(world)["reason"])

    def test_the_recovery_unit_says_who_runs_recover(self, world: World) -> None:
        """The rendered recovery unit sets AGENT_FSM_RECOVERY=unit for the script it runs."""
        world.installed("1.0.0")
        unit = world.paths.recovery_unit.read_text()
        assert f"Environment={reasons.RECOVERY_ENV}=unit" in unit.splitlines()


class TestCarried:
    def rolled_back(self, world: World) -> World:
        world.installed("1.0.0")
        world.upgrading("2.0.0")
        world.node.controller.fire("judge_failed", reason="started 3 times, more than "
                                   "max_attempts (2)", reason_class="crashed")
        recover(world.node)
        world.node.controller.fire("recovered")
        return world

    def test_history_shows_the_reason(self, world: World) -> None:
        """`history` shows the class and words on the transition that reported the result."""
        self.rolled_back(world)
        entries = history(world.node).to_json()
        failed = next(e for e in entries if e["trigger"] == "judge_failed")
        assert failed["reason_class"] == "crashed" and "started 3 times" in failed["reason"]
        assert next(e for e in entries if e["trigger"] == "settle")["reason_class"] is None

    def test_the_published_result_carries_it(self, world: World) -> None:
        """The result queued for delivery (and the publish command's stdin) has reason and
        reason_class."""
        self.rolled_back(world)
        sent = world.publisher.recorded[-1].to_json()
        assert sent["reason_class"] == "crashed" and "started 3 times" in sent["reason"]

    def test_the_outbox_json_carries_it_and_is_checked(self, tmp_path: Path) -> None:
        """RecordPublisher writes the reason to the outbox; a result without one (an ok one) is
        valid, one with an unknown class is not."""
        pub = RecordPublisher(tmp_path / "results", outbox=tmp_path / "outbox",
                              document=validate.RESULT)
        pub.record(Result("1.0.0", "2.0.0", "rolled_back", 1.0, 2.0, "stopped while being "
                          "judged", "stopped"))
        raw = next((tmp_path / "outbox").iterdir()).read_bytes()
        validate.result_file(raw)
        assert json.loads(raw)["reason_class"] == "stopped"
        ok = {"from": "1.0.0", "to": "2.0.0", "outcome": "ok", "started": 1.0, "time": 2.0}
        validate.result_file(validate.RESULT.encode(ok))
        with pytest.raises(ValueError, match="reason_class"):
            validate.result_file(validate.RESULT.encode({**ok, "reason_class": "bored"}))

    def test_metrics_count_rollbacks_by_reason_class(self, world: World) -> None:
        """`metrics` has agent_fsm_rollbacks_by_reason_total, one sample per class."""
        self.rolled_back(world)
        text = exposition(collect(world.node))
        assert 'agent_fsm_rollbacks_by_reason_total{agent="agent",reason_class="crashed"} 1' \
            in text
        assert 'agent_fsm_rollbacks_by_reason_total{agent="agent",reason_class="manual"} 0' \
            in text

    def test_an_older_last_result_shows_null_reasons(self, world: World) -> None:
        """A last result recorded before reasons were kept shows reason and class as null."""
        self.rolled_back(world)
        doc = world.node.store.read()
        assert doc.last_result is not None
        doc.last_result = {k: v for k, v in doc.last_result.items()
                           if k not in ("reason", "reason_class")}
        with world.node.store.locked():
            world.node.store.write(doc)
        assert (last(world)["reason"], last(world)["reason_class"]) == (None, None)


def test_a_long_or_multi_line_reason_is_kept_as_one_bounded_line() -> None:
    """A reason is all of its text on one line, line breaks and control characters written
    visibly, at most MAX_REASON characters: no line of it can stand alone as the reason."""
    assert reasons.one_line("first\n\nlast one\n") == "first\\n\\nlast one"
    assert len(reasons.one_line("x" * 2000)) == reasons.MAX_REASON
    assert reasons.one_line("a\x1bb") == "a\\x1bb"

