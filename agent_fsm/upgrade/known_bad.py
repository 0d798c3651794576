"""The known-bad marks as the machine keeps them (the record: `node.records.known_bad`).

`mark_known_bad` marks the candidate a rollback leaves; `clear_known_bad` unmarks a version
judged ok. `overrides` refuses an upgrade to a marked version.
"""

from __future__ import annotations

import logging

from ..machine.engine import Step
from ..node.records import known_bad
from ..node.state import reasons
from .effectors import Effectors

log = logging.getLogger("agent_fsm")


def mark_known_bad(effectors: Effectors, step: Step) -> None:
    """Mark the candidate known bad with its result's reason, once; an orphan's rollback marks nothing."""
    up = effectors.pending_upgrade(step)
    r = step.doc.last_result or {}
    if r.get("to") != up.to_version or r.get("started") != up.started:
        r = {}  # not this upgrade's result: mark it all the same
    if r.get("reason_class") == reasons.ORPHANED:
        log.info("release %s is not marked known bad: it rolled back unjudged (%s)",
                 up.to_version, r.get("reason"))
        return
    mark = known_bad.Mark(up.to_version, float(r.get("time", step.arg("started"))),
                          str(r.get("reason", "")), str(r.get("reason_class", reasons.ReasonClass.unknown)),
                          up.started)
    if known_bad.mark(effectors.paths.known_bad_file, mark):
        log.warning("release %s is now known bad: `agent-fsm upgrade --to %s` is refused unless "
                    "--force", up.to_version, up.to_version)


def clear_known_bad(effectors: Effectors, step: Step) -> None:
    """Unmark a version judged ok: it works here now."""
    version = effectors.pending_upgrade(step).to_version
    if known_bad.clear(effectors.paths.known_bad_file, version):
        log.info("release %s is no longer known bad: it was judged ok", version)
