"""`agent-fsm start-check`: the agent unit's `ExecStartPre=`, run with the last-good's binary.

Start limits are agent-fsm's, not systemd's (`StartLimitIntervalSec=0`). A `daemon-reload` resets
systemd's start count up to 254 and keeps it from 255. A limit of systemd's would let a candidate
escape recovery while anything reloads systemd (252), and leave a converged agent that crashed twice
failed (257). So:

- While an upgrade is pending and the candidate is selected, the last-good's code counts each
  start in the signal (`starts`) before the candidate's code runs. A candidate that crashes on
  import is counted too.
- Once `max_attempts` starts are used up, the next start starts the recovery unit and is refused
  (exit 1). systemd restarts the unit as after any failure, and each refused start asks for
  recovery again. Once `recover` has selected the last-good, the start goes on.
- Each counted start records whether the attempt before it ended by the start timeout
  (`start_timeout`), so the rollback can say so.
- A start that cannot be counted is refused as at the bound, after starting the recovery unit,
  when the state file knows an upgrade `recover` rolls back. The signal is gone or unreadable,
  or the state dir not writable (`DiskError`); an uncounted candidate could not record a verdict
  either. A candidate judged ok is not among them: its `complete` clears the signal itself.
- Otherwise (nothing pending, the last-good selected, or judged ok) it does nothing.

An unexpected failure here lets the start go on. The check must never keep the agent down; the
candidate's daemon still counts its attempts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..errors import AgentFsmError, DiskError, SignalError
from ..machine.vocabulary import StateName
from ..node.runtime import signal
from ..system.systemd import Systemctl, Systemd
from ..wiring import Node, Reader
from . import start_timeout

log = logging.getLogger("agent_fsm")

ALLOW = 0
REFUSE = 1


def start_check(node: Node | Reader, systemd: Systemd | None = None) -> int:
    """Count this start of a candidate; ALLOW it, or REFUSE it when its starts are used up or it
    cannot be counted. Refusing, it first starts the recovery unit through `systemd` (None: the
    config's). It needs only a reader's parts and the writers' lock: no engine on every start's
    path."""
    if _last_good_starts(node):
        return ALLOW  # the way back, or a converged agent: nothing to count
    try:
        sig = node.signal()
    except SignalError:
        sig = None  # decided under the lock, with the state file
    if sig is not None and node.releases.selected() != sig.to_version:
        return ALLOW  # nothing to count yet
    shown = _shown(node, systemd) if sig is not None else {}
    try:
        with node.store.locked():
            # Again, under the writers' lock: `recover` may have moved on.
            counted = _count(node, shown)
    except DiskError as exc:
        counted = f"the state dir cannot be written ({exc})"
    if isinstance(counted, str):
        log.error("could not count this start of candidate %s: %s; starting %s and refusing "
                  "this start", node.releases.selected(), counted, node.paths.recovery_unit_name)
        return _refuse(node, systemd)
    if counted is None:
        return ALLOW
    most = node.config.judgment.max_attempts
    if counted.starts <= most:
        log.info("start %d of candidate %s (of %d allowed)", counted.starts, counted.to_version,
                 most)
        return ALLOW
    log.error("candidate %s started %d times, more than max_attempts (%d): starting %s and "
              "refusing this start", counted.to_version, counted.starts, most,
              node.paths.recovery_unit_name)
    return _refuse(node, systemd)


def _last_good_starts(node: Node | Reader) -> bool:
    selected = node.releases.selected()
    return selected is None or selected == node.releases.last_good()


def _shown(node: Node | Reader, systemd: Systemd | None) -> dict[str, str]:
    """What systemd shows of the agent unit for `start_timeout`; nothing when it cannot say."""
    try:
        return (systemd or Systemctl(node.config.systemctl)).show(
            node.paths.agent_unit_name, start_timeout.PROPERTIES)
    except AgentFsmError as exc:  # counted all the same, its end not told
        log.warning("could not read %s from systemd: %s", node.paths.agent_unit_name, exc)
        return {}


def _count(node: Node | Reader, shown: dict[str, str]) -> signal.UpgradeSignal | str | None:
    """Count this start in the signal, with what systemd `shown` of the attempt before; the caller
    holds the writers' lock. The signal as counted; None when there is nothing to count; or why the
    start cannot be counted while an upgrade the way back rolls back is known. DiskError when the
    count cannot be written."""
    if _last_good_starts(node):
        return None
    doc = node.store.read()
    try:
        sig = node.signal()
    except SignalError as exc:
        lost = f"its upgrade signal cannot be read ({exc})"
    else:
        if sig is not None:
            if node.releases.selected() != sig.to_version or doc.state == StateName.judged_ok:
                return None  # not its signal, or judged already: this start only finishes `complete`
            sig = sig._replace(starts=sig.starts + 1, **start_timeout.counted(
                sig, shown, node.config.judgment.max_attempts))
            signal.write(node.paths.signal_file, sig)
            return sig
        lost = f"its upgrade signal {node.paths.signal_file} is gone"
    back = node.groups.recover_from
    known = doc.state in back or (doc.pending is not None and doc.pending.dest in back)
    owed = f", {doc.pending.trigger} owed" if doc.pending is not None else ""
    return f"{lost}, while the state file ({doc.state}{owed}) knows its upgrade" if known else None


def _refuse(node: Node | Reader, systemd: Systemd | None) -> int:
    """Start the recovery unit (the way back) and REFUSE this start."""
    try:
        (systemd or Systemctl(node.config.systemctl)).start(node.paths.recovery_unit_name)
    except AgentFsmError as exc:  # refused all the same: the next restart asks again
        log.error("could not start %s: %s", node.paths.recovery_unit_name, exc)
    return REFUSE


def main(open_node: Callable[[], Node | Reader]) -> int:
    """Run the check; an unexpected failure, an unreadable config too, is logged and lets the start
    go on."""
    from .runtime import setup_logging

    setup_logging()
    try:
        return start_check(open_node())
    except Exception as exc:  # never keep the agent down over the check itself
        log.warning("start check failed (%s: %s); letting the start go on", type(exc).__name__,
                    exc)
        return ALLOW
