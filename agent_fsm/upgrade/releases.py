"""The releases as the machine moves them (the pointers: `node.releases.pointers`)."""

from __future__ import annotations

import contextlib
import logging

from ..errors import AgentFsmError, Refused, ReleaseError
from ..machine.engine import Step
from ..node.assets import kept as kept_assets
from ..node.records import known_bad, known_good
from ..node.state.reasons import one_line
from ..system.publish import Result
from .effectors import Effectors

log = logging.getLogger("agent_fsm")


def release_exists(effectors: Effectors, step: Step) -> AgentFsmError | None:
    """The release is stored and intact, every byte read (`Releases.reread`), before it is run."""
    try:
        effectors.releases.reread(str(step.arg("release")))
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
    """Select the last-good, mended first if it fails its check (`way_back`).

    The way back never stops on one damaged file.
    """
    last_good = effectors.releases.last_good()
    if last_good is None:
        raise ReleaseError("there is no last-good release to roll back to")
    effectors.releases.select(way_back(effectors, step, last_good))


def way_back(effectors: Effectors, step: Step | None, last_good: str, *,
             fall_back: bool = True) -> str:
    """The release the way back goes to: `last_good`, mended if it must be.

    A damaged last-good is repaired from intact copies, else the newest intact known-good
    release (not known bad, not the candidate) becomes the last-good, and the result says so.
    ReleaseError when nothing intact is left, or when `fall_back` is False.
    """
    try:
        fixed = effectors.releases.mend(last_good)
    except ReleaseError as damaged:
        if not fall_back:
            raise
        return _fall_back(effectors, step, last_good, damaged)
    if fixed:
        names = tuple(rel for rel, _ in fixed)
        event = known_good.WayBack(effectors.clock.now(), last_good, "repaired", last_good,
                                   names, "; ".join(f"{rel} from {src}" for rel, src in fixed))
        log.error("the way back: %s", event.words())
        _tell(effectors, step, event)
    return last_good


def _fall_back(effectors: Effectors, step: Step | None, last_good: str,
               damaged: ReleaseError) -> str:
    releases, paths = effectors.releases, effectors.paths
    record = known_good.read_or_empty(paths.known_good_file)
    # Never the candidate, nor a version that rolled back here (a damaged known-bad record
    # reads as none: the candidate is still left out).
    avoid = {last_good, *(m["version"] for m in known_bad.view(paths)[0])}
    if step is not None:
        with contextlib.suppress(AgentFsmError):
            avoid.add(effectors.pending_upgrade(step).to_version)
    tried = []
    for version in known_good.newest_first(record):
        if version in avoid or not releases.exists(version):
            continue
        try:
            releases.mend(version)
        except ReleaseError as exc:
            tried.append(f"{version}: {exc}")
            continue
        failed = kept_assets.keep_release(paths, releases, version)
        if failed is not None:
            log.error("release %s's assets cannot be kept for the way back: %s", version, failed)
        releases.promote(version)
        known_good.promoted(paths.known_good_file, version, effectors.clock.now())
        event = known_good.WayBack(effectors.clock.now(), last_good, "fell_back", version, (),
                                   one_line(str(damaged)))
        log.error("the way back: %s", event.words())
        _tell(effectors, step, event)
        return version
    raise ReleaseError(f"{damaged}; no known-good release to fall back to is intact"
                       + (f" ({'; '.join(tried)})" if tried else
                          " (none other was promoted here)")) from None


def _tell(effectors: Effectors, step: Step | None, event: known_good.WayBack) -> None:
    """Record the way back's repair or fallback for `status` and the result; a failure is only logged."""
    try:
        known_good.took_way_back(effectors.paths.known_good_file, event)
    except AgentFsmError as exc:
        log.warning("could not record the way back in %s: %s", effectors.paths.known_good_file,
                    exc)
    if step is None or not step.doc.last_result:
        return
    step.doc.last_result = {**step.doc.last_result, "way_back": event.words()}
    try:
        effectors.publisher.record(Result.from_json(step.doc.last_result))
    except AgentFsmError as exc:
        log.warning("could not record the way back in the result: %s", exc)


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
    try:  # where the way back may fall back to: never a failed promotion
        known_good.promoted(effectors.paths.known_good_file, selected, effectors.clock.now())
    except AgentFsmError as exc:
        log.warning("could not note release %s as known good in %s: %s", selected,
                    effectors.paths.known_good_file, exc)
