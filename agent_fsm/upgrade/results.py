"""An upgrade's result as the machine reports it (the record and delivery: `system.publish`).

`publish_result` records and delivers it before the transition goes on. `record_result` queues
it, so the way back never waits on the publish command; the last-good's daemon delivers it. A
re-run reports a result once.
"""

from __future__ import annotations

from ..machine.engine import Step
from ..machine.vocabulary import StateName
from ..node.state.reasons import CLASSES, ReasonClass, one_line
from ..system.publish import Outcome, Result
from .effectors import Effectors


def _result(effectors: Effectors, step: Step) -> Result | None:
    """The result this transition reports, or None when it was reported already."""
    up, ok = effectors.pending_upgrade(step), step.dest == StateName.converged
    outcome: Outcome = "ok" if ok else "rolled_back"
    last = step.doc.last_result
    if last and last.get("to") == up.to_version and last.get("started") == up.started \
            and last.get("outcome") == outcome:
        return None
    default = ReasonClass.passed if ok else ReasonClass.unknown
    why = str(step.arg("reason_class") or default)
    since = step.arg("publisher_unreachable_since")  # complete_queued's: a dead publisher
    return Result(up.from_version, up.to_version, outcome, up.started, effectors.clock.now(),
                  one_line(str(step.arg("reason") or CLASSES[default])),
                  why if why in CLASSES else ReasonClass.unknown,
                  float(since) if isinstance(since, int | float) else None,
                  None if up.channel is None else dict(up.channel))


def publish_result(effectors: Effectors, step: Step) -> None:
    """Record the result and deliver it (and any older one queued) before going on."""
    result = _result(effectors, step)
    if result is None:
        effectors.publisher.deliver()  # recorded by an earlier run; the delivery may be owed
        return
    effectors.publisher.publish(result)
    step.doc.last_result = result.to_json()


def record_result(effectors: Effectors, step: Step) -> None:
    """Record the result, queued for the last-good's daemon to deliver."""
    result = _result(effectors, step)
    if result is None:
        return
    effectors.publisher.record(result)
    step.doc.last_result = result.to_json()
