"""No wait on an upgrade's path that is not policy: the judge re-checks soon after a first
failure, and `upgrade --wait` notices the end within milliseconds."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from agent_fsm.actions.upgrade import follow
from agent_fsm.agent.judge import CHECK_INTERVAL, judge
from agent_fsm.node.config import Judgment
from agent_fsm.node.state.store import StateDoc
from agent_fsm.testing import FakeClock
from tests.helpers import make_world

J = Judgment(deadline_seconds=10, soak_seconds=5, max_attempts=2, checks=(("check",),))


def _checks(clock: FakeClock, passing_from: int,
            ) -> tuple[list[float], Callable[[Sequence[str], float], tuple[bool, str]]]:
    times: list[float] = []

    def check(argv: Sequence[str], timeout: float) -> tuple[bool, str]:
        times.append(clock.now())
        return len(times) > passing_from, "check exited 1: not yet"

    return times, check


class TestJudgeCadence:
    def test_a_check_passing_at_the_second_try_is_not_kept_waiting(self) -> None:
        """A candidate whose check fails once (its workload still starting) is re-checked
        within a tenth of a second, not a full interval later; then the whole soak follows."""
        clock = FakeClock()
        times, check = _checks(clock, 1)
        verdict = judge(J, attempt=1, clock=clock, check=check)
        assert verdict.ok
        assert times[1] - times[0] <= 0.1
        assert clock.now() - times[1] >= J.soak_seconds

    def test_failing_checks_back_off_to_the_interval_and_fail_at_the_deadline(self) -> None:
        """Checks that keep failing are re-run less and less often, never more than the check
        interval apart, and the candidate is judged failed at the deadline, not before."""
        clock = FakeClock()
        start = clock.now()
        times, check = _checks(clock, 10_000)
        verdict = judge(J, attempt=1, clock=clock, check=check)
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert not verdict.ok and "at the deadline" in verdict.reason
        assert clock.now() - start >= 10 and clock.now() - start < 10 + 0.1
        assert gaps == sorted(gaps[:-1]) + gaps[-1:] and max(gaps) <= CHECK_INTERVAL
        assert len(times) < 20  # backed off: not a busy loop


def _late(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> float:
    """Seconds between the node converging, right after `follow` looked, and `follow` returning."""
    world = make_world(tmp_path / "root").installed("1.0.0")
    world.add_release("2.0.0")
    c = world.node.controller
    up = c.fire("begin_upgrade", release="2.0.0").upgrade
    assert up is not None
    c.fire("candidate_started")
    c.fire("judge_ok")
    looked = threading.Event()
    read = world.node.store.read

    def read_and_tell() -> StateDoc:
        doc = read()
        looked.set()
        return doc

    monkeypatch.setattr(world.node.store, "read", read_and_tell)
    finished: list[float] = []

    def complete() -> None:
        looked.wait(10)
        c.fire("complete")
        finished.append(time.perf_counter())

    worker = threading.Thread(target=complete)
    worker.start()
    outcome = follow(world.node, up.started, "2.0.0", 30)
    returned = time.perf_counter()
    worker.join()
    assert outcome.outcome == "ok"
    return returned - finished[0]


def test_wait_notices_the_end_within_milliseconds(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """`upgrade --wait` returns within a few hundredths of a second of the node converging (the
    best of three tries, so that a loaded machine does not fail it)."""
    lates = [_late(tmp_path / str(i), monkeypatch) for i in range(3)]
    assert min(lates) < 0.12, lates
