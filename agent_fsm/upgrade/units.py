"""What the machine asks systemd of the agent's units, and whether recovery is still at work.

`reload_systemd` always reloads, after every asset was written; nothing relies on its side
effects. `reload_systemd_if_changed` serves a start and the way back: a reload re-reads every
unit on the host (70-160 ms in the e2e sandbox), so it runs only when systemd reports
`NeedDaemonReload=`, or any doubt.
"""

from __future__ import annotations

import logging

from ..errors import AgentFsmError, Refused
from ..machine.engine import Step
from .effectors import Effectors

log = logging.getLogger("agent_fsm")


# The recovery unit's ActiveState while it is at work: a oneshot's try runs ("activating"), or
# waits to be started again after a failed one ("activating", sub-state "auto-restart"; on
# systemd 255+ it passes through "failed-before-auto-restart" on the way). A oneshot is "active"
# only once done (kept so by a drop-in's `RemainAfterExit=yes`): not at work.
AT_WORK = frozenset({"activating", "deactivating"})


def recovery_at_work(effectors: Effectors) -> str | None:
    """The recovery unit's state ("activating (auto-restart)") while it is at work, else None.

    None too when systemd cannot say (logged): nothing is known to be at work.
    """
    unit = effectors.paths.recovery_unit_name
    try:
        shown = effectors.systemd.show(unit, ("ActiveState", "SubState"))
    except (AgentFsmError, OSError) as exc:
        log.info("could not ask systemd whether %s is at work: %s", unit, exc)
        return None
    active, sub = shown.get("ActiveState", ""), shown.get("SubState", "")
    if active in AT_WORK or "auto-restart" in sub:
        return f"{active} ({sub})" if sub else active
    return None


def recovery_idle(effectors: Effectors, step: Step) -> AgentFsmError | None:
    """Refuse a new upgrade while the recovery unit is at work. No `--force` goes past it.

    A failed try retries even after its upgrade ended; finding a new candidate judged, it would
    roll that back and mark it known bad. `upgrade` waits for it (`wait_for_recovery`).
    """
    now = recovery_at_work(effectors)
    if now is None:
        return None
    unit = effectors.paths.recovery_unit_name
    return Refused(
        f"{unit} is still at work ({now}): it was started for the last upgrade and would roll "
        f"this one back as the one that failed; wait until `systemctl is-active {unit}` says "
        "inactive (its next try, within about 30 s, finds nothing pending and ends it), then "
        "upgrade again"
    )


def reset_start_limit(effectors: Effectors, step: Step) -> None:
    effectors.systemd.reset_failed(effectors.paths.agent_unit_name)


def restart_unit(effectors: Effectors, step: Step) -> None:
    if not step.arg("no_start"):
        effectors.systemd.restart(effectors.paths.agent_unit_name)


def enable_unit(effectors: Effectors, step: Step) -> None:
    if not step.arg("no_start"):
        effectors.systemd.enable(effectors.paths.agent_unit_name)


def start_recovery(effectors: Effectors, step: Step) -> None:
    effectors.systemd.start(effectors.paths.recovery_unit_name)


def reload_systemd(effectors: Effectors, step: Step) -> None:
    effectors.systemd.daemon_reload()


def reload_systemd_if_changed(effectors: Effectors, step: Step) -> None:
    units = (effectors.paths.agent_unit_name, effectors.paths.recovery_unit_name)
    try:
        needed = effectors.systemd.reload_needed(units)
    except (AgentFsmError, OSError) as exc:
        log.info("could not ask systemd whether the unit files changed (%s): reloading", exc)
        needed = True
    if needed:
        effectors.systemd.daemon_reload()
    else:
        log.info("systemd has the unit files as they are on disk: no daemon-reload")
