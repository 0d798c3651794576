"""The follow timer on the host (its units: `node.assets.follow_units`). `install` and each agent
start keep it once the gate is open, never a transition. So nothing on the way back waits on it or
fails for it.

With a `[channel] url`, the two units are written where they differ and systemd reloads them. The
timer is enabled and running, and restarted when its file changed, so a new window counts at once. A
start that finds them right costs one `systemctl show`. Without a url, a timer left from an earlier
config is stopped, disabled and deleted, and systemd reloaded.
"""

from __future__ import annotations

import logging

from .. import files
from ..errors import AgentFsmError, AssetError
from ..node.assets import follow_units
from ..node.assets import render as assets
from .effectors import Effectors

log = logging.getLogger("agent_fsm")


def keep(effectors: Effectors, *, start: bool = True) -> str | None:
    """Write or remove the follow timer as the config says; with `start`, have it enabled and
    running. Returns what was done in words (None: nothing to do). AgentFsmError (SystemdError,
    DiskError, AssetError) when it cannot."""
    paths, systemd = effectors.paths, effectors.systemd
    timer = paths.follow_timer_name
    if paths.config.channel.url is None:
        return _remove(effectors)
    try:
        units = follow_units.render(paths)
    except ValueError as exc:
        raise AssetError(f"cannot write the follow timer {timer}: {exc}; change it in the "
                         "config") from None
    written = assets.converge(units)
    if written:
        systemd.daemon_reload()
    if not start:
        return f"{timer} written, not started (--no-start)" if written else None
    if written:
        systemd.enable(timer)
        systemd.restart(timer)
        return f"{timer} written, enabled and started ({paths.config.channel.window})"
    shown = systemd.show(timer, ("ActiveState", "UnitFileState"))
    did = []
    if shown.get("UnitFileState") != "enabled":
        systemd.enable(timer)
        did.append("enabled")
    if shown.get("ActiveState") != "active":
        systemd.start(timer)
        did.append("started")
    return f"{timer} {' and '.join(did)}" if did else None


def _remove(effectors: Effectors) -> str | None:
    paths, systemd = effectors.paths, effectors.systemd
    there = [p for p in (paths.follow_timer, paths.follow_service) if p.is_symlink() or p.exists()]
    if not there:
        return None
    try:
        systemd.disable(paths.follow_timer_name)
    except AgentFsmError as exc:  # its file is deleted all the same: it is not started again
        log.info("could not stop and disable %s: %s", paths.follow_timer_name, exc)
    for path in there:
        files.remove(path)
    systemd.daemon_reload()
    return f"{paths.follow_timer_name} stopped and removed (the config names no channel)"


def keep_logged(effectors: Effectors, *, start: bool = True) -> str | None:
    """`keep`, its failure logged, never raised: following a channel is never on the way back, and
    the next install or agent start tries again."""
    try:
        done = keep(effectors, start=start)
    except (AgentFsmError, OSError) as exc:
        log.warning("could not keep the follow timer %s: %s; the next start of the agent tries "
                    "again", effectors.paths.follow_timer_name, exc)
        return f"the follow timer could not be written: {exc}"
    if done is not None:
        log.info("%s", done)
    return done
