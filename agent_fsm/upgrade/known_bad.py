"""The known-bad rule as the machine runs it: `not_known_bad` refuses an upgrade to a version
that rolled back here (unless forced), `mark_known_bad` marks the candidate a rollback leaves,
`clear_known_bad` takes the mark off a version judged ok (the record: `node.known_bad`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..errors import AgentFsmError
from ..machine.engine import Step
from ..node.records import known_bad
from .registry import condition, effect

if TYPE_CHECKING:
    from .effects import Host

log = logging.getLogger("agent_fsm")


@condition
def not_known_bad(host: Host, step: Step) -> AgentFsmError | None:
    return known_bad.refusal(host.paths.known_bad_file, str(step.arg("release")),
                             force=bool(step.arg("force")))


@effect
def mark_known_bad(host: Host, step: Step) -> None:
    """Mark the candidate known bad, why as its recorded result says; a re-run marks once."""
    up = host._upgrade(step)
    r = step.doc.last_result or {}
    if r.get("to") != up.to_version or r.get("started") != up.started:
        r = {}  # not this upgrade's result: mark it all the same
    mark = known_bad.Mark(up.to_version, float(r.get("time", step.arg("started"))),
                          str(r.get("reason", "")), str(r.get("reason_class", "unknown")),
                          up.started)
    if known_bad.mark(host.paths.known_bad_file, mark):
        log.warning("release %s is now known bad: `agent-fsm upgrade --to %s` is refused unless "
                    "--force", up.to_version, up.to_version)


@effect
def clear_known_bad(host: Host, step: Step) -> None:
    """The version was judged ok: whatever marked it before, it works here now."""
    version = host._upgrade(step).to_version
    if known_bad.clear(host.paths.known_bad_file, version):
        log.info("release %s is no longer known bad: it was judged ok", version)
