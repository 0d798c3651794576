"""Why an upgrade ended as it did: a `ReasonClass`, and words for a failed candidate.

A failed candidate is described from the agent unit's `Result`, `ExecMainStatus` and
`NRestarts`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from ...untrusted import shown

MAX_REASON = 500  # characters of a reason kept: one line, cut with an ellipsis

class ReasonClass(enum.StrEnum):
    """Why, in one word (a result's `reason_class`)."""

    passed = "passed"
    check_failed = "check_failed"
    crashed = "crashed"
    deadline = "deadline"
    stopped = "stopped"
    manual = "manual"
    orphaned = "orphaned"
    unknown = "unknown"


# Each class, and when a result gets it (docs/operations.md lists the same).
CLASSES: dict[ReasonClass, str] = {
    ReasonClass.passed: "judged ok: its checks passed and it stayed up for the soak",
    ReasonClass.check_failed: "a check failed (the reason names it, with its last output line)",
    ReasonClass.crashed: "the candidate or its workload exited, or kept restarting, while being "
                         "judged",
    ReasonClass.deadline: "the judgment was not over by its deadline (systemd's start timeout)",
    ReasonClass.stopped: "the agent was stopped while the candidate was being judged (recorded "
                         "only before a stop was no verdict: now the next start judges it again)",
    ReasonClass.manual: "an operator ran `agent-fsm recover`",
    ReasonClass.orphaned: "a signal without an upgrade in the state file, or an upgrade in the "
                          "state file whose signal was lost: the candidate was never judged",
    ReasonClass.unknown: "no reason was recorded (a result from before reasons were kept)",
}
PROPERTIES = ("Result", "ExecMainStatus", "NRestarts", "TimeoutStartUSec")
# What the recovery unit's environment carries, so `recover` tells its run from an operator's.
RECOVERY_ENV = "AGENT_FSM_RECOVERY"


def one_line(text: str) -> str:
    """`text` as a reason is kept: on one line, control characters visible, at most MAX_REASON."""
    return shown(text.strip(), MAX_REASON)


def from_unit(unit: str, shown: Mapping[str, str], refused_after: int | None = None,
              timeouts: int = 0) -> tuple[str, ReasonClass]:
    """(reason, class) for a candidate whose agent unit failed, from `systemctl show`.

    `refused_after`: the start after which the last-good's start check refused the next, whose
    exit status is then reported. `timeouts`: the last attempts in a row that hit systemd's
    start timeout.
    """
    result = shown.get("Result", "")
    status, starts = shown.get("ExecMainStatus", "?"), shown.get("NRestarts", "?")
    if refused_after is not None and timeouts:
        return (f"{unit} did not finish starting within its start timeout (TimeoutStartSec="
                f"{shown.get('TimeoutStartUSec') or '?'}) in {timeouts} attempt(s) in a row; "
                f"after {refused_after} start(s) (max_attempts) the last-good's start check "
                f"refused the next", ReasonClass.deadline)
    if refused_after is not None:
        return (f"{unit} failed {refused_after} start(s) in a row (max_attempts) without being "
                f"judged ok; the last-good's start check refused the next (result "
                f"{result or '?'}, restarted {starts} time(s))", ReasonClass.crashed)
    if result == "timeout":
        return (f"{unit} did not finish starting within its start timeout (the judgment "
                f"deadline; restarted {starts} time(s))", ReasonClass.deadline)
    if not result:
        return f"{unit} failed while being judged (systemd's view of it could not be read)", \
            ReasonClass.crashed
    return (f"{unit} failed at start: result {result}, exit status {status}, restarted "
            f"{starts} time(s)", ReasonClass.crashed)


def entry_keys(result: Mapping[str, Any] | None, reported: object) -> dict[str, Any]:
    """The reason, in words and as a class, that a history entry keeps of its `reported` result."""
    if not reported or result is None or "reason_class" not in result:
        return {}
    return {"reason": result.get("reason"), "reason_class": result["reason_class"]}


def publish_given_up(error: str, seconds: float, since: float) -> dict[str, Any]:
    """The arguments of `complete_queued`: a passed candidate whose result could not be published."""
    return {"reason_class": "passed",
            "reason": one_line(f"judged ok; the result was queued in the outbox after "
                               f"publishing it failed for {seconds:g}s: {one_line(error)}"),
            "publisher_unreachable_since": since}


# The class of an orphaned signal's rollback and of a lost signal's: never judged, never marked.
ORPHANED = ReasonClass.orphaned


def orphaned(state: str) -> dict[str, str]:
    """The reason recorded for a signal the state file, in `state`, knew nothing of."""
    return {"reason_class": ORPHANED,
            "reason": f"an upgrade signal existed but the state file ({state}) knew no upgrade"}


def signal_lost(state: str, how: str) -> dict[str, str]:
    """The reason recorded for a known upgrade whose signal was lost (`how`: gone, or unreadable).

    It rolled back unjudged. It has the orphans' class, which every release's reader knows.
    """
    return {"reason_class": ORPHANED,
            "reason": one_line(f"the upgrade signal was lost ({how}) while the state file "
                               f"({state}) knew the upgrade: rolled back unjudged")}
