"""The service assets as transitions write them (rendering: `node.assets`).

`begin_upgrade` runs `converge_assets` while the last-good is selected, so the candidate is
judged under the config the operator wrote; `settings_apply` refuses first if that cannot
render. `hold_assets` keeps the last-good's files during an upgrade, writing only missing ones.
`write_assets` writes all; `converge_assets` those that differ. Both keep the `bin_link`.
"""

from __future__ import annotations

import logging

from ..errors import AgentFsmError, AssetError, Refused, ReleaseError
from ..machine.engine import Step
from ..node.assets import bin_link
from ..node.assets import kept as kept_assets
from ..node.assets import render as assets
from .effectors import Effectors

log = logging.getLogger("agent_fsm")


def settings_apply(effectors: Effectors, step: Step) -> AgentFsmError | None:
    """Refuse an upgrade when the last-good's units do not render with the current settings."""
    version = effectors.releases.last_good()
    try:
        if version is None:
            raise ReleaseError("there is no last-good release")
        effectors.rendered(version)
    except (AssetError, ReleaseError) as exc:
        return Refused(f"the upgrade would not be judged under the current config: last-good "
                       f"{version}'s units cannot be rendered with it ({exc})")
    return None


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
    rendered = effectors.rendered()
    written = assets.converge(rendered)
    if written:
        log.info("rewrote asset(s) that differed: %s", ", ".join(str(a.path) for a in written))
    keep_last_good_copy(effectors, rendered)
    keep_link(effectors)


def keep_last_good_copy(effectors: Effectors, rendered: tuple[assets.Asset, ...]) -> None:
    """When the selected release is the last-good, keep what it renders now as its copy, if changed.

    A failure is logged; holding then renders from the last-good's release.
    """
    paths, version = effectors.paths, effectors.releases.selected()
    if version is None or version != effectors.releases.last_good():
        return
    try:
        kept = kept_assets.read(paths.last_good_assets)
    except AssetError:
        kept = None
    if kept is not None and kept.version == version and kept.fits(paths) \
            and kept.assets(paths) == rendered:
        return
    try:
        kept_assets.keep(paths, version, rendered)
    except AgentFsmError as exc:
        log.warning("could not keep last-good %s's assets in %s: %s", version,
                    paths.last_good_assets, exc)


def keep_link(effectors: Effectors) -> None:
    """Keep `agent-fsm` on PATH; a failure is logged, since the link is for people and no unit uses it."""
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
