"""What the machine asks systemd of the agent's units: reset the agent unit's start limit,
restart and enable it, start the recovery unit, and have systemd read the unit files again;
and whether the recovery unit is still at work, which refuses a new upgrade (`recovery_idle`).

`reload_systemd` is unconditional, where every asset was just written (`install`, `activate`,
`complete`). Nothing relies on a reload's side effects: up to systemd 254 a `daemon-reload`
also reset a unit's start count, since 255 it does not, and the agent unit has no start limit
(`StartLimitIntervalSec=0`: its starts are counted by `agent.start_check`).

`reload_systemd_if_changed` is for a start (`settle`) and the way back (`recovered`): the
files were written by an earlier start or held, byte for byte, since systemd last loaded them,
so the reload that re-reads every unit of the host (70 to 160 ms in the end-to-end sandbox,
more on a full host) is needed only if a file was written since — which systemd tells
(`NeedDaemonReload=`) in one `systemctl show`. Any doubt (a unit not loaded, systemctl
failing) means reloading.
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
    """The recovery unit's state ("activating (auto-restart)") while it is at work, else None;
    None too when systemd cannot say (logged): nothing is known to be at work."""
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
    """Refuse a new upgrade while the recovery unit is at work. It was started for the upgrade
    before, and a try of it that failed (a held lock, a refused restart) tries again even when
    that upgrade has ended another way (the last-good's own start, an operator's `recover`):
    finding this upgrade's candidate being judged, it would roll it back as the one that failed
    and mark it known bad. Its next try finds nothing pending and it stops; `upgrade` waits
    for that first (`actions.upgrade.wait_for_recovery`). No `--force` goes past it."""
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
