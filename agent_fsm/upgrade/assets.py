"""The service assets as transitions write them, and systemd's reload that follows.

`hold_assets` keeps the last-good's files while an upgrade is pending, writing only missing
ones, from the last-good's kept copy. `write_assets` writes the selected release's assets
whatever is on disk, `converge_assets` those that differ (content or mode), and
`reload_systemd` has systemd read them. That reload is unconditional: besides reading the
files, a `daemon-reload` resets systemd's count of the agent unit's starts, and a converged
agent restarted by hand or after a crash relies on it not to reach `StartLimitBurst=`
(`tests/e2e/test_upgrades.py`, plain restarts).

`reload_systemd_if_changed` is for the way back (`recovered`): the last-good's files were
held, byte for byte, since systemd last loaded them, so the reload that re-reads every unit of
the host (70 to 160 ms in the end-to-end sandbox, more on a full host) is needed only if a
file was written since — which systemd tells (`NeedDaemonReload=`) in one `systemctl show`.
Any doubt (a unit not loaded, systemctl failing) means reloading. The start-limit count it
leaves is the one `recover` reset before this start.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..errors import AgentFsmError
from ..machine.engine import Step
from ..node.assets import kept as kept_assets
from ..node.assets import render as assets
from .registry import effect

if TYPE_CHECKING:
    from .effects import Host

log = logging.getLogger("agent_fsm")


@effect
def hold_assets(host: Host, step: Step) -> None:
    on_disk = [p for p in host.asset_paths() if p.exists()]
    if on_disk:
        log.info("upgrade pending: holding the last-good's asset(s) %s",
                 ", ".join(map(str, on_disk)))
    if len(on_disk) == len(host.asset_paths()):
        return  # nothing missing
    # Only the last-good's: the candidate's release and templates are never read here.
    found = kept_assets.last_good(host.paths, host.releases)
    log.log(logging.WARNING if found.fallback else logging.INFO,
            "upgrade pending: restoring missing asset(s) %s", found.source)
    written = assets.hold(found.assets)
    log.info("upgrade pending: wrote missing asset(s) %s",
             ", ".join(str(a.path) for a in written))


@effect
def write_assets(host: Host, step: Step) -> None:
    assets.write_all(host.rendered())


@effect
def converge_assets(host: Host, step: Step) -> None:
    written = assets.converge(host.rendered())
    if written:
        log.info("rewrote asset(s) that differed: %s", ", ".join(str(a.path) for a in written))


@effect
def reload_systemd(host: Host, step: Step) -> None:
    host.systemd.daemon_reload()


@effect
def reload_systemd_if_changed(host: Host, step: Step) -> None:
    units = (host.paths.agent_unit_name, host.paths.recovery_unit_name)
    try:
        needed = host.systemd.reload_needed(units)
    except (AgentFsmError, OSError) as exc:
        log.info("could not ask systemd whether the unit files changed (%s): reloading", exc)
        needed = True
    if needed:
        host.systemd.daemon_reload()
    else:
        log.info("systemd has the unit files as they are on disk: no daemon-reload")
