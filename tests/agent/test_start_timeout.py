"""The start check tells an attempt systemd's start timeout ended from a crash, and the
rollback after the candidate's starts are used up says which."""

from __future__ import annotations

from typing import Any

import pytest

from agent_fsm.actions.recover import recover
from agent_fsm.agent.start_check import ALLOW, REFUSE, start_check
from agent_fsm.agent.start_timeout import span
from tests.helpers import World

TIMEOUT, DELAY = 12.0, 1.0


def _shown(at: float, restarts: int, **more: str) -> dict[str, str]:
    """What systemd shows of the agent unit inside `ExecStartPre=` of a start `at` seconds."""
    return {"NRestarts": str(restarts), "SubState": "start-pre",
            "StateChangeTimestampMonotonic": str(int(at * 1e6)), "TimeoutStartUSec": "12s",
            "RestartUSec": "1s", **more}


def _upgrade(world: World) -> None:
    world.installed("1.0.0")
    world.add_release("2.0.0")
    world.node.controller.fire("begin_upgrade", release="2.0.0")


def _start(world: World, shown: dict[str, str]) -> int:
    world.systemd.shown = shown
    return start_check(world.node, world.systemd)


def _rolled_back(world: World) -> dict[str, Any]:
    world.systemd.shown = {"Result": "exit-code", "ExecMainStatus": "1", "NRestarts": "3",
                           "TimeoutStartUSec": "12s"}
    recover(world.node, by_unit=True)
    result = world.node.store.read().last_result
    assert result is not None
    return result


class TestTheRollbackSaysHowTheAttemptsEnded:
    def test_attempts_the_start_timeout_ended_are_the_deadline(self, world: World) -> None:
        """Three attempts, each restarted by systemd no sooner than its start timeout and
        restart delay: the rollback is class deadline, in words naming the timeout."""
        _upgrade(world)
        at = 1000.0
        for n in range(3):
            assert _start(world, _shown(at, n)) == ALLOW
            at += TIMEOUT + DELAY + 0.4
        assert _start(world, _shown(at, 3)) == REFUSE
        result = _rolled_back(world)
        assert result["reason_class"] == "deadline"
        assert result["reason"].startswith(
            "agent.service did not finish starting within its start timeout "
            "(TimeoutStartSec=12s) in 3 attempt(s) in a row; after 3 start(s) (max_attempts)")

    def test_attempts_that_crashed_are_crashed(self, world: World) -> None:
        """Attempts restarted sooner than a start timeout after they began crashed."""
        _upgrade(world)
        at = 1000.0
        for n in range(4):
            _start(world, _shown(at, n))
            at += 2.0
        result = _rolled_back(world)
        assert result["reason_class"] == "crashed"
        assert result["reason"].startswith("agent.service failed 3 start(s) in a row")

    def test_the_last_attempt_decides_and_counts_the_timeouts_in_a_row(self, world: World) -> None:
        """A crash then two timeouts: deadline, in 2 attempts; a timeout then a crash: crashed."""
        _upgrade(world)
        at = 1000.0
        for n, lived in enumerate((2.0, TIMEOUT + DELAY, TIMEOUT + DELAY)):
            _start(world, _shown(at, n))
            at += lived
        _start(world, _shown(at, 3))
        result = _rolled_back(world)
        assert (result["reason_class"], "in 2 attempt(s)" in result["reason"]) == ("deadline", True)

    def test_a_stop_or_reboot_in_between_is_no_timeout(self, world: World) -> None:
        """A start long after the one before, but not systemd's own restart (NRestarts back at
        0: a stop and a start, a reboot), is no timeout."""
        _upgrade(world)
        for n in range(3):
            _start(world, _shown(1000.0 + 2 * n, n))
        assert _start(world, _shown(5000.0, 0)) == REFUSE  # stopped, started by hand later
        assert _rolled_back(world)["reason_class"] == "crashed"

    def test_the_growing_restart_delay_is_the_one_that_follows(self, world: World) -> None:
        """With growing delays (`RestartUSecNext`), a crash after a long restart delay is not
        taken for a timeout, and a timeout is one whatever the delay."""
        _upgrade(world)
        _start(world, _shown(1000.0, 0, RestartUSecNext="30s"))
        _start(world, _shown(1000.0 + 5 + 30, 1, RestartUSecNext="30s"))  # crashed after 5 s
        sig = world.node.signal()
        assert sig is not None and sig.timeouts == 0
        _start(world, _shown(1035.0 + TIMEOUT + 30, 2, RestartUSecNext="30s"))
        sig = world.node.signal()
        assert sig is not None and sig.timeouts == 1

    def test_systemd_that_cannot_say_counts_the_start_and_records_a_crash(
            self, world: World) -> None:
        """When systemd's view of the unit cannot be read, every start is counted and refused
        as before, and the rollback is recorded as crashed."""
        _upgrade(world)
        world.systemd.fail = {"show"}
        assert [start_check(world.node, world.systemd) for _ in range(4)] == [ALLOW] * 3 + [REFUSE]
        world.systemd.fail = set()
        assert _rolled_back(world)["reason_class"] == "crashed"

    def test_a_time_the_signal_cannot_keep_is_not_recorded(self, world: World) -> None:
        """A start timeout too long to be kept records nothing: the signal stays readable, and
        the start is counted."""
        _upgrade(world)
        assert _start(world, _shown(1000.0, 0, TimeoutStartUSec="9" * 400 + "s")) == ALLOW
        sig = world.node.signal()
        assert sig is not None and (sig.starts, sig.timed_out_by) == (1, None)

    def test_refused_starts_after_the_count_keep_it(self, world: World) -> None:
        """Starts refused again while recovery is on its way keep the count of timeouts."""
        _upgrade(world)
        at = 1000.0
        for n in range(3):
            _start(world, _shown(at, n))
            at += TIMEOUT + DELAY
        for n in range(3, 6):
            assert _start(world, _shown(at, n)) == REFUSE
            at += 1.0
        assert "in 3 attempt(s)" in _rolled_back(world)["reason"]


class TestSpan:
    @pytest.mark.parametrize(("text", "seconds"), [
        ("12s", 12.0), ("200ms", 0.2), ("1.216440s", 1.21644), ("1min 30s", 90.0),
        ("1h 2min", 3720.0), ("500us", 0.0005)])
    def test_systemds_time_spans_read_as_seconds(self, text: str, seconds: float) -> None:
        """Time spans as `systemctl show` prints them read as seconds."""
        assert span(text) == pytest.approx(seconds)

    @pytest.mark.parametrize("text", ["infinity", "", None, "12", "12 parsecs"])
    def test_anything_else_is_no_span(self, text: str | None) -> None:
        """No timeout, nothing, or words systemd does not print are no span."""
        assert span(text) is None
