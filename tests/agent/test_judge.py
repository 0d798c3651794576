"""Judging a candidate, with a fake clock and fake checks: no processes, no waiting."""

from __future__ import annotations

from collections.abc import Sequence

from agent_fsm.agent.judge import judge, run_check
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
        assert ok and not bad and msg == "sh exited 3: nope"
