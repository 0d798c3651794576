"""Where `upgrade --wait` is, in words. Piped: a timestamped line per phase (`Lines`). On a
terminal: the live line's words (`words`). No rich: the fast path prints the piped lines."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from ..actions.upgrade import Phase, Progress
from ..machine.vocabulary import StateName
from ..untrusted import shown


def words(p: Progress) -> str:
    """The phase of `p` in words. While judging: the attempt, the time to the deadline, and each
    check's last answer or the soak's time left."""
    to = shown(p.to_version)
    if p.phase is Phase.starting:
        return f"candidate {to} starting"
    if p.phase in (Phase.judging, Phase.soaking):
        left = "" if p.deadline_in is None else f"; deadline in {max(p.deadline_in, 0):.0f}s"
        soak = "" if p.soak_left is None else f"; checks passed, soak {p.soak_left:.0f}s left"
        said = ", ".join(f"{shown(a.check, 60)} ok" if a.ok else shown(a.said, 120)
                         for a in p.answers)
        checks = f"; checks: {said}" if said and p.soak_left is None else ""
        return f"judging {to}: attempt {p.attempt} of {p.max_attempts}{left}{soak}{checks}"
    if p.phase is Phase.publishing:
        return f"{to} judged ok; publishing the result"
    if p.phase is Phase.rolling_back and p.state == StateName.judged_failed:
        return f"{to} judged failed; rolling back"
    if p.phase is Phase.rolling_back:
        return f"rolling back from {to}"
    if p.phase is Phase.converged:
        return f"converged on {to}"
    if p.phase is Phase.rolled_back:
        return f"rolled back from {to}"
    return f"state {shown(p.state)}"


def stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Lines:
    """Says one line when the phase or the attempt judged changes, never per read. For example:
    `2026-12-03T09:30:01Z +  1.2s judging 2.0.0: attempt 1 of 3; deadline in 60s`."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self._say = say
        self._last: tuple[Phase, str, int] | None = None

    def __call__(self, p: Progress) -> None:
        key = (p.phase, p.state if p.phase is Phase.other else "",
               p.attempt if p.phase is Phase.judging else 0)
        if key == self._last:
            return
        self._last = key
        self._say(f"{stamp(p.time)} +{p.after:6.1f}s {words(p)}")
