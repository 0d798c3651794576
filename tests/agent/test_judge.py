"""Judging a candidate, with a fake clock and fake checks (no processes, no waiting); and the
process groups its real checks run in."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from agent_fsm.agent.judge import AFTER_SOAK, judge, run_check
from agent_fsm.node.config import Judgment
from agent_fsm.testing import FakeClock

J = Judgment(deadline_seconds=10, soak_seconds=5, max_attempts=2, checks=(("check",),))


def passing_after(n: int):  # type: ignore[no-untyped-def]
    calls = {"n": 0}

    def check(argv: Sequence[str], timeout: float) -> tuple[bool, str]:
        calls["n"] += 1
        return calls["n"] > n, "check exited 1: not yet"

    return check


class TestJudge:
    def test_checks_pass_then_soak(self) -> None:
        """Checks passing after a few tries, then a quiet soak: judged ok after the soak time."""
        clock = FakeClock()
        start = clock.now()
        v = judge(J, attempt=1, clock=clock, check=passing_after(3))
        assert v.ok
        assert clock.now() - start >= 5  # the soak, after the checks passed

    def test_checks_failing_at_deadline(self) -> None:
        """Checks still failing at the deadline: judged failed, naming the last failure."""
        clock = FakeClock()
        v = judge(J, attempt=1, clock=clock, check=passing_after(99))
        assert not v.ok and "at the deadline" in v.reason and "not yet" in v.reason

    def test_too_many_attempts(self) -> None:
        """A candidate restarted beyond max_attempts judges itself failed without checking."""
        v = judge(J, attempt=3, clock=FakeClock(), check=passing_after(0))
        assert not v.ok and "more than max_attempts (2)" in v.reason

    def test_each_round_and_the_soak_are_told(self) -> None:
        """Each round of the checks is told with every check's answer, then the soak's
        seconds as it begins: what `upgrade --wait` shows."""
        told: list[tuple[list[tuple[bool, str]], float | None]] = []
        v = judge(J, attempt=1, clock=FakeClock(), check=passing_after(2),
                  told=lambda answers, soak: told.append(([(ok, m) for _, ok, m in answers],
                                                          soak)))
        assert v.ok
        assert told == [([(False, "check exited 1: not yet")], None)] * 2 + [
            ([(True, "check exited 1: not yet")], None), ([(True, "check exited 1: not yet")], 5)]

    def test_workload_dying_in_soak(self) -> None:
        """The workload exiting during the soak fails the judgment."""
        clock = FakeClock()
        start = clock.now()
        v = judge(J, attempt=1, clock=clock, check=passing_after(0),
                  alive=lambda: clock.now() < start + 2)
        assert not v.ok and "during the soak" in v.reason

    def test_real_check_process(self) -> None:
        """A check is a real command passing on exit 0, told the candidate's version."""
        ok, _ = run_check(["sh", "-c", 'test "$AGENT_FSM_VERSION" = 2.0.0'],
                          {"AGENT_FSM_VERSION": "2.0.0"}, 10)
        bad, msg = run_check(["sh", "-c", "echo nope >&2; exit 3"], {}, 10)
        assert ok and not bad and msg == 'sh exited 3: "nope"'


class TestMonotonic:
    def test_a_wall_clock_step_forward_does_not_end_the_soak(self) -> None:
        """A +1 h step of the wall clock (NTP) just after the checks pass neither ends the soak
        early nor hides a workload that dies during it: judged failed, as without the step."""
        clock = FakeClock()
        start = clock.monotonic()

        def check(argv: Sequence[str], timeout: float) -> tuple[bool, str]:
            clock.step(3600)
            return True, "ok"

        v = judge(J, attempt=1, clock=clock, check=check,
                  alive=lambda: clock.monotonic() < start + 3)
        assert not v.ok and "during the soak" in v.reason

    def test_a_wall_clock_step_backward_does_not_stretch_the_soak(self) -> None:
        """A -1 h step during the soak: judged ok once the soak's time has passed, not an hour
        later (which would run into the unit's start timeout)."""
        clock = FakeClock()
        start = clock.monotonic()
        v = judge(J, attempt=1, clock=clock, check=lambda argv, timeout: (True, "ok"),
                  alive=lambda: clock.step(-3600) is None)
        assert v.ok
        assert J.soak_seconds <= clock.monotonic() - start < J.soak_seconds + 1

    def test_each_check_is_given_the_time_left(self) -> None:
        """A slow check is given as its timeout the time left before the deadline, never the
        whole deadline again; after the soak, the time left in the judgment's room."""
        clock = FakeClock()
        start = clock.monotonic()
        given: list[tuple[float, float]] = []  # (time into the judgment, timeout given)

        def slow(argv: Sequence[str], timeout: float) -> tuple[bool, str]:
            given.append((clock.monotonic() - start, timeout))
            clock.advance(min(3.0, timeout))  # it takes 3 s, or is killed at its timeout
            return len(given) > 3, "check exited 1: not yet"

        v = judge(J, attempt=1, clock=clock, check=slow)
        assert v.ok
        in_deadline = [(at, t) for at, t in given if at < J.deadline_seconds]
        assert in_deadline[0] == (0, J.deadline_seconds)
        assert all(t == pytest.approx(J.deadline_seconds - at) for at, t in in_deadline)
        assert given[-1][1] <= AFTER_SOAK

    def test_no_check_runs_past_the_deadline(self) -> None:
        """A check that always takes its whole timeout fails the judgment at the deadline,
        not a check's timeout later."""
        clock = FakeClock()
        start = clock.monotonic()

        def hangs(argv: Sequence[str], timeout: float) -> tuple[bool, str]:
            clock.advance(timeout)
            return False, f"check did not finish within {timeout:g}s (killed)"

        v = judge(J, attempt=1, clock=clock, check=hangs)
        assert not v.ok and "at the deadline" in v.reason
        assert clock.monotonic() - start == pytest.approx(J.deadline_seconds)


def _gone(pid: int) -> bool:
    """Whether the process has ended (gone, or a zombie nobody reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


class TestProcessGroups:
    def test_a_check_is_killed_whole_at_its_timeout(self, tmp_path: Path) -> None:
        """A check that forks a child and hangs is killed at its timeout with the child: the
        check fails saying so, and no process of it is left."""
        pidfile = tmp_path / "child.pid"
        ok, msg = run_check(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"], {}, 0.5)
        assert not ok and "did not finish within 0.5s (killed)" in msg
        child = int(pidfile.read_text())
        assert _wait(lambda: _gone(child)), f"the check's child {child} outlived its timeout"

    def test_the_publish_command_is_killed_whole_at_its_timeout(self, tmp_path: Path) -> None:
        """A publish command that forks a child and hangs is killed with its child at its
        timeout: publishing fails (and is retried), no process of it is left."""
        from agent_fsm.errors import PublishError
        from agent_fsm.node.state import validate
        from agent_fsm.system.publish import RecordPublisher, Result

        pidfile = tmp_path / "child.pid"
        publisher = RecordPublisher(tmp_path / "results", ("sh", "-c", f"sleep 60 & echo $! > "
                                                           f"{pidfile}; wait"), timeout=0.5,
                                    outbox=tmp_path / "outbox", document=validate.RESULT)
        with pytest.raises(PublishError, match=r"did not finish within 0\.5s"):
            publisher.publish(Result("1.0.0", "2.0.0", "ok", 1.0, 2.0))
        child = int(pidfile.read_text())
        assert _wait(lambda: _gone(child)), f"the publisher's child {child} outlived it"


def _wait(predicate: Callable[[], bool], timeout: float = 10) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return False
