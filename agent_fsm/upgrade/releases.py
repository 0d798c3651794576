"""The releases as the machine moves them (the pointers themselves: `node.releases.pointers`):
whether the one asked for exists and is not already selected, whether recovery left the
last-good selected; selecting a release or the last-good, and promoting the selected one to
last-good."""

from __future__ import annotations

import logging

from ..errors import AgentFsmError, Refused, ReleaseError
from ..machine.engine import Step
from ..node.assets import kept as kept_assets
from .effectors import Effectors

log = logging.getLogger("agent_fsm")


def release_exists(effectors: Effectors, step: Step) -> AgentFsmError | None:
    try:
        effectors.releases.manifest(str(step.arg("release")))
    except ReleaseError as exc:
        return exc
    return None


def not_selected(effectors: Effectors, step: Step) -> AgentFsmError | None:
    if effectors.releases.selected() != step.arg("release"):
        return None
    return Refused(f"release {step.arg('release')} is already selected; nothing to upgrade")


def last_good_selected(effectors: Effectors, step: Step) -> AgentFsmError | None:
    selected, last_good = effectors.releases.selected(), effectors.releases.last_good()
    if selected == last_good:
        return None
    return Refused(
        f"recovery is not finished: {selected} is selected but the last-good is "
        f"{last_good}; run `agent-fsm recover`"
    )


def select_release(effectors: Effectors, step: Step) -> None:
    effectors.releases.select(str(step.arg("release")))


def select_last_good(effectors: Effectors, step: Step) -> None:
    last_good = effectors.releases.last_good()
    if last_good is None:
        raise ReleaseError("there is no last-good release to roll back to")
    effectors.releases.select(last_good)


def promote_last_good(effectors: Effectors, step: Step) -> None:
    selected = effectors.releases.selected()
    if selected is None:
        raise ReleaseError("no release is selected, so none can be promoted to last-good")
    # Keep its rendered assets first, so holding them during the next upgrade needs no
    # release directory (a crash before the pointer moves re-runs both). Rendered for this
    # host's systemd, as `write_assets` renders them.
    effectors.systemd_version()
    failed = kept_assets.keep_release(effectors.paths, effectors.releases, selected)
    if failed is not None:
        log.error("release %s's assets cannot be kept for the way back: %s", selected, failed)
    effectors.releases.promote(selected)
