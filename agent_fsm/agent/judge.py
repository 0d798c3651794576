"""Judging a candidate: the host's checks pass within a deadline, then it stays up a soak time.

The checks come from the host's config, never the candidate. The loop runs over injected parts,
so it is tested without processes or waiting. It runs on a monotonic clock within one start;
across restarts only the signal's attempt count decides. Each check's timeout is the time left:
a command runs in its own process group, killed whole at timeout; an HTTP(S) check is one GET
(`system.http_probe`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..node.check_config import Check as CheckSpec
from ..node.check_config import HttpCheck
from ..node.config import Judgment
from ..node.state.reasons import ReasonClass
from ..system import http_probe, proc
from ..untrusted import quoted

CHECK_INTERVAL = 1.0  # the longest wait between two runs of the checks
# A check failing at first is re-run soon, then less and less often: a workload is usually ready
# milliseconds after it starts, and a full interval there would delay every upgrade by up to 1 s.
FIRST_RECHECK = 0.05
# The checks after the soak may take this long past deadline + soak: within the unit's start
# timeout (deadline + soak + 10 s, `node.assets.render`), with room left to publish.
AFTER_SOAK = 5.0


class Timer(Protocol):
    """The judgment's clock: monotonic time and a sleep (the daemon's ends at SIGTERM)."""

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


# Runs one check (an argv or an HTTP check) with a timeout: (passed, what it said).
Check = Callable[[CheckSpec, float], tuple[bool, str]]


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str
    reason_class: ReasonClass = ReasonClass.passed


NO_TIME = "no time was left to run the checks"
CUT = 1.0  # an HTTP check given less than this by the deadline, which then timed out, was cut


def run_check(check: CheckSpec, env: dict[str, str], timeout: float) -> tuple[bool, str]:
    """Run one check: (passed, agent-fsm's words with the check's own in double quotes)."""
    if isinstance(check, HttpCheck):
        return http_probe.get(check.url, check.status, min(timeout, check.timeout_seconds))
    argv: Sequence[str] = check
    try:
        done = proc.run(argv, timeout=timeout, env=env, group=True)
    except proc.CouldNotRun as exc:
        return False, f"{argv[0]}: {exc.reason}"
    return done.returncode == 0, f"{argv[0]} exited {done.returncode}" + (
        f": {quoted(done.tail)}" if done.tail else "")


# Each check's answer in one round: (the check, passed, what it said).
Answers = list[tuple[CheckSpec, bool, str]]


def _checks(judgment: Judgment, clock: Timer, check: Check, end: float,
            cut: list[str] | None = None,
            answers: Answers | None = None) -> tuple[list[str], bool]:
    """Run every check with the time left before `end`; return the failures' words and whether all ran.

    An HTTP check cut short by the deadline (under `CUT` s) goes in `cut`: it says less than the
    answer before it.
    """
    failing: list[str] = []
    for spec in judgment.checks:
        left = min(end - clock.monotonic(), judgment.deadline_seconds)
        if left <= 0:
            return failing, False
        ok, msg = check(spec, left)
        if answers is not None:
            answers.append((spec, ok, msg))
        if not ok:
            short = (isinstance(spec, HttpCheck) and left < min(spec.timeout_seconds, CUT)
                     and msg.endswith("(timeout)"))
            (cut if short and cut is not None else failing).append(msg)
    return failing, True


def judge(
    judgment: Judgment,
    *,
    attempt: int,
    clock: Timer,
    check: Check,
    alive: Callable[[], bool] = lambda: True,
    exited: Callable[[str], str] = lambda when: f"the workload exited {when}",
    stopping: Callable[[], bool] = lambda: False,
    told: Callable[[Answers, float | None], None] = lambda _answers, _soak: None,
) -> Verdict:
    """Decide whether the candidate is healthy, on this start's monotonic clock.

    Failed past `max_attempts`, when the checks do not all pass within `deadline_seconds`, when
    the workload dies, or when a check fails after the soak. Stopped (no verdict, signal kept)
    when `stopping` says so. `told` hears each round's answers.
    """
    if attempt > judgment.max_attempts:
        return Verdict(False, f"started {attempt} times, more than max_attempts "
                              f"({judgment.max_attempts})", ReasonClass.crashed)
    deadline = clock.monotonic() + judgment.deadline_seconds
    last = NO_TIME
    wait = FIRST_RECHECK
    while True:
        if stopping():
            return Verdict(False, "stopped while being judged", ReasonClass.stopped)
        if not alive():
            return Verdict(False, exited("while being judged"), ReasonClass.crashed)
        cut: list[str] = []
        answers: Answers = []
        failing, ran = _checks(judgment, clock, check, deadline, cut, answers)
        told(answers, None)
        if ran and not failing and not cut:
            break
        if failing or (cut and last == NO_TIME):
            last = (failing or cut)[0]
        if clock.monotonic() >= deadline:
            return Verdict(False, f"checks still failing at the deadline: {last}",
                           ReasonClass.check_failed)
        clock.sleep(min(wait, max(deadline - clock.monotonic(), 0.05)))
        wait = min(wait * 2, CHECK_INTERVAL)
    soak_end = clock.monotonic() + judgment.soak_seconds
    told(answers, judgment.soak_seconds)
    while (left := soak_end - clock.monotonic()) > 0:
        if stopping():
            return Verdict(False, "stopped during the soak", ReasonClass.stopped)
        if not alive():
            return Verdict(False, exited("during the soak"), ReasonClass.crashed)
        clock.sleep(min(CHECK_INTERVAL, left))
    if stopping():
        return Verdict(False, "stopped at the end of the soak", ReasonClass.stopped)
    if not alive():
        return Verdict(False, exited("during the soak"), ReasonClass.crashed)
    failing, ran = _checks(judgment, clock, check, soak_end + AFTER_SOAK)
    if failing or not ran:
        why = failing[0] if failing else "no time was left to run the checks"
        return Verdict(False, f"a check failed after the soak: {why}", ReasonClass.check_failed)
    return Verdict(True, f"checks passed and it stayed up {judgment.soak_seconds:g}s"
                   if judgment.checks else f"stayed up {judgment.soak_seconds:g}s (no checks)")
