"""Judging a candidate: the host's checks pass within a deadline, then it stays up a soak time.

The checks come from the host's config, never from the candidate. The judgment is a loop over
injected parts (running a check, whether the workload is alive, the clock), so it is tested
without processes and without waiting.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..node.config import Judgment
from ..system import proc
from ..system.clock import Clock

CHECK_INTERVAL = 1.0  # the longest wait between two runs of the checks
# A check failing at first is re-run soon, then less and less often: a workload is usually ready
# milliseconds after it starts, and a full interval there delayed every upgrade by up to 1 s.
FIRST_RECHECK = 0.05


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str
    reason_class: str = "passed"  # one of `node.reasons.CLASSES`


def run_check(argv: Sequence[str], env: dict[str, str], timeout: float) -> tuple[bool, str]:
    """Run one check; it passes on exit 0. Returns (passed, what it said)."""
    try:
        done = proc.run(argv, timeout=timeout, env=env)
    except proc.CouldNotRun as exc:
        return False, f"{argv[0]}: {exc.reason}"
    return done.returncode == 0, f"{argv[0]} exited {done.returncode}" + (
        f": {done.tail}" if done.tail else "")


def judge(
    judgment: Judgment,
    *,
    attempt: int,
    deadline: float,
    clock: Clock,
    check: Callable[[Sequence[str]], tuple[bool, str]],
    alive: Callable[[], bool] = lambda: True,
    stopping: Callable[[], bool] = lambda: False,
) -> Verdict:
    """Decide whether the candidate is healthy.

    Failed when: this is a start beyond `max_attempts` (the candidate keeps restarting); the
    checks do not all pass by `deadline`; the workload dies; or a check fails after the soak.
    """
    if attempt > judgment.max_attempts:
        return Verdict(False, f"started {attempt} times, more than max_attempts "
                              f"({judgment.max_attempts})", "crashed")
    last = "no checks configured"
    wait = FIRST_RECHECK
    while True:
        if stopping():
            return Verdict(False, "stopped while being judged", "stopped")
        if not alive():
            return Verdict(False, "the workload exited while being judged", "crashed")
        results = [check(argv) for argv in judgment.checks]
        failing = [msg for ok, msg in results if not ok]
        if not failing:
            break
        last = failing[0]
        if clock.now() >= deadline:
            return Verdict(False, f"checks still failing at the deadline: {last}", "check_failed")
        clock.sleep(min(wait, max(deadline - clock.now(), 0.05)))
        wait = min(wait * 2, CHECK_INTERVAL)
    soak_end = clock.now() + judgment.soak_seconds
    while clock.now() < soak_end:
        if stopping():
            return Verdict(False, "stopped during the soak", "stopped")
        if not alive():
            return Verdict(False, "the workload exited during the soak", "crashed")
        clock.sleep(min(CHECK_INTERVAL, soak_end - clock.now()))
    failing = [msg for ok, msg in (check(argv) for argv in judgment.checks) if not ok]
    if failing:
        return Verdict(False, f"a check failed after the soak: {failing[0]}", "check_failed")
    return Verdict(True, f"checks passed and it stayed up {judgment.soak_seconds:g}s"
                   if judgment.checks else f"stayed up {judgment.soak_seconds:g}s (no checks)")
