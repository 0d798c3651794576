"""What the machine asks systemd of the agent's units: reset the agent unit's start limit,
restart and enable it, start the recovery unit, and have systemd read the unit files again.

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

from ..errors import AgentFsmError
from ..machine.engine import Step
from .effectors import Effectors

log = logging.getLogger("agent_fsm")


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
