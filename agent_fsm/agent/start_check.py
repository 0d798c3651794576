"""`agent-fsm start-check`: the agent unit's `ExecStartPre=`, run with the last-good's binary.

Start limits are agent-fsm's policy, not systemd's (the unit has `StartLimitIntervalSec=0`):
systemd's count of a unit's starts is reset by a `daemon-reload` up to systemd 254 and kept by
one since 255, so a candidate bounded by it never reaches recovery while anything else on the
host reloads systemd (252), and a converged agent that crashes twice is left failed (257). So:

- while an upgrade is pending and the candidate is selected, each start of the agent unit is
  counted here, in the signal (`starts`), by the last-good's code and before the candidate's
  runs: a candidate that crashes before its own daemon counts (a broken import, a launcher
  that exits) is counted all the same, whatever reloads systemd;
- once `max_attempts` starts are used up, the next start starts the recovery unit and is
  refused (exit 1): the candidate's code does not run again. systemd restarts the unit as it
  does after any failure, each refused start asks for recovery again (so a recovery unit that
  could not start is retried), and once `recover` has selected the last-good the start goes on;
- when the state dir cannot be written (full, read-only: `DiskError`), the start cannot be
  counted and the candidate could not record a verdict either: the check starts the recovery
  unit and refuses the start, as at the bound, so the way back is tried (and retried by the
  recovery unit's own `Restart=`) while the fault lasts, not the candidate uncounted;
- otherwise (no upgrade pending, the last-good selected: the way back, or the candidate judged
  ok already: its start only finishes `complete`) it does nothing.

`agent-fsm stop-check` is the unit's `ExecStopPost=`, also the last-good's: after each counted
start of the candidate it keeps how that start ended (`$SERVICE_RESULT`, which systemd gives it)
in the signal's `ended`, so that a rollback after `max_attempts` starts stopped by systemd's
start timeout is recorded as the deadline it is, not as a crash. It never fails the unit.

Whatever fails here unexpectedly lets the start go on: a start check that cannot count must
never be what keeps the agent down (the candidate's own daemon still counts its attempts).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..errors import AgentFsmError, DiskError
from ..machine.vocabulary import StateName
from ..node.runtime import signal
from ..node.state import validate
from ..system.systemd import Systemctl, Systemd
from ..wiring import Node, Reader

log = logging.getLogger("agent_fsm")

ALLOW = 0
REFUSE = 1


def start_check(node: Node | Reader, systemd: Systemd | None = None) -> int:
    """Count this start of a candidate; ALLOW it, or REFUSE it once its starts are used up
    (after starting the recovery unit through `systemd`: the config's systemctl if None). It
    needs no more of the node than a reader's parts and the writers' lock: none of the engine,
    on the path of every start."""
    sig = node.signal()
    if sig is None:
        return ALLOW
    selected = node.releases.selected()
    if selected is None or selected == node.releases.last_good() or selected != sig.to_version:
        return ALLOW  # the way back (the last-good starts), or nothing to count yet
    candidate = sig.to_version
    try:
        with node.store.locked():
            sig = node.signal()  # again, under the writers' lock: `recover` may have moved on
            if sig is None or node.releases.selected() != sig.to_version:
                return ALLOW
            if node.store.read().state == StateName.judged_ok:
                return ALLOW  # judged already: this start only finishes `complete`
            sig = sig._replace(starts=sig.starts + 1)
            signal.write(node.paths.signal_file, sig)
    except DiskError as exc:
        log.error("could not count this start of candidate %s (%s): starting %s and refusing "
                  "this start", candidate, exc, node.paths.recovery_unit_name)
        return _refuse(node, systemd)
    most = node.config.judgment.max_attempts
    if sig.starts <= most:
        log.info("start %d of candidate %s (of %d allowed)", sig.starts, sig.to_version, most)
        return ALLOW
    log.error("candidate %s started %d times, more than max_attempts (%d): starting %s and "
              "refusing this start", sig.to_version, sig.starts, most,
              node.paths.recovery_unit_name)
    return _refuse(node, systemd)


def stop_check(node: Node | Reader, service_result: str) -> int:
    """Keep how a counted start of the candidate ended (`service_result`: systemd's
    `$SERVICE_RESULT`) in the signal; the refused starts past `max_attempts` keep nothing, so
    the last counted start's end stays. Always ALLOW."""
    sig = node.signal()
    if sig is None or not validate.SERVICE_RESULT_RE.match(service_result):
        return ALLOW
    if not _counted(node, sig):
        return ALLOW  # read without the lock first: a refused start never waits for `recover`
    with node.store.locked():
        sig = node.signal()
        if sig is None or not _counted(node, sig) or sig.ended == service_result:
            return ALLOW
        if node.store.read().state == StateName.judged_ok:
            return ALLOW
        signal.write(node.paths.signal_file, sig._replace(ended=service_result))
    log.info("start %d of candidate %s ended: %s", sig.starts, sig.to_version, service_result)
    return ALLOW


def _counted(node: Node | Reader, sig: signal.UpgradeSignal) -> bool:
    """Whether the start that just ended was one of the candidate's counted starts."""
    return (node.releases.selected() == sig.to_version != node.releases.last_good()
            and 0 < sig.starts <= node.config.judgment.max_attempts)


def _refuse(node: Node | Reader, systemd: Systemd | None) -> int:
    """Start the recovery unit (the way back) and REFUSE this start."""
    try:
        (systemd or Systemctl(node.config.systemctl)).start(node.paths.recovery_unit_name)
    except AgentFsmError as exc:  # refused all the same: the next restart asks again
        log.error("could not start %s: %s", node.paths.recovery_unit_name, exc)
    return REFUSE


def main(open_node: Callable[[], Node | Reader], *, stopped: bool = False) -> int:
    """Run the check (`stopped`: the stop check, with systemd's `$SERVICE_RESULT`); any
    unexpected failure (logged) lets the start go on. `open_node` builds the node: a config
    that cannot be read is such a failure too."""
    import os

    from .runtime import setup_logging

    setup_logging()
    try:
        if stopped:
            return stop_check(open_node(), os.environ.get("SERVICE_RESULT", ""))
        return start_check(open_node())
    except Exception as exc:  # never keep the agent down over the check itself
        log.warning("%s check failed (%s: %s); letting the start go on",
                    "stop" if stopped else "start", type(exc).__name__, exc)
        return ALLOW
