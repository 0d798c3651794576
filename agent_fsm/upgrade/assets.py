"""The service assets as transitions write them (rendering them: `node.assets`); systemd reads
them when `units.reload_systemd` follows.

`hold_assets` keeps the last-good's files while an upgrade is pending, writing only missing
ones, from the last-good's kept copy. `write_assets` writes the selected release's assets
whatever is on disk, `converge_assets` those that differ (content or mode). Both keep the
`bin_link` too (`agent-fsm` on PATH, through `selected`), logging, never failing, when they
cannot.
"""

from __future__ import annotations

import logging

from ..errors import AgentFsmError
from ..machine.engine import Step
from ..node.assets import bin_link
from ..node.assets import kept as kept_assets
from ..node.assets import render as assets
from .effectors import Effectors

log = logging.getLogger("agent_fsm")


def hold_assets(effectors: Effectors, step: Step) -> None:
    where = [written for _, written, _ in assets.targets(effectors.paths).values()]
    on_disk = [p for p in where if p.exists()]
    if on_disk:
        log.info("upgrade pending: holding the last-good's asset(s) %s",
                 ", ".join(map(str, on_disk)))
    if len(on_disk) == len(where):
        return  # nothing missing
    # Only the last-good's: the candidate's release and templates are never read here.
    effectors.systemd_version()  # what the kept copy was rendered for, if it was this boot
    found = kept_assets.last_good(effectors.paths, effectors.releases)
    log.log(logging.WARNING if found.fallback else logging.INFO,
            "upgrade pending: restoring missing asset(s) %s", found.source)
    written = assets.hold(found.assets)
    log.info("upgrade pending: wrote missing asset(s) %s",
             ", ".join(str(a.path) for a in written))


def write_assets(effectors: Effectors, step: Step) -> None:
    assets.write_all(effectors.rendered())
    keep_link(effectors)


def converge_assets(effectors: Effectors, step: Step) -> None:
    written = assets.converge(effectors.rendered())
    if written:
        log.info("rewrote asset(s) that differed: %s", ", ".join(str(a.path) for a in written))
    keep_link(effectors)


def keep_link(effectors: Effectors) -> None:
    """Keep `agent-fsm` on PATH; a link that cannot be kept is logged, never a failure (it is
    for people, and the units never run through it)."""
    before = bin_link.look(effectors.paths)
    try:
        link = bin_link.keep(effectors.paths)
    except (AgentFsmError, OSError) as exc:
        log.warning("could not write the link %s: %s", before.path, exc)
        return
    if link.state == "foreign":
        log.warning("%s", link.words())
    elif before.state != link.state:
        log.info("wrote the link %s", link.words())
