"""The operator's commands: install, upgrade (and follow it), activate, recover.

Each returns a frozen result for the CLI to render; refusals and errors are raised.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import AgentFsmError, SystemdError
from ..machine.definition import OnRecover, handlers
from ..machine.vocabulary import StateName, Trigger
from ..node.assets import bin_link
from ..node.state import reasons
from ..node.state.store import StateDoc
from ..upgrade import units, way_back
from ..wiring import Node

log = logging.getLogger("agent_fsm")


@dataclass(frozen=True)
class Done:
    """What a command did, in one line, plus the state it left."""

    message: str
    state: str


def install(node: Node, version: str, *, start: bool = True) -> Done:
    doc = node.controller.fire(Trigger.install, release=version, no_start=not start)
    how = "enabled and restarted" if start else "not started (--no-start)"
    return Done(f"installed {version}: all assets written, systemd reloaded, "
                f"{node.paths.agent_unit_name} {how}{_on_path(node)}", doc.state)


def activate(node: Node, version: str) -> Done:
    doc = node.controller.fire(Trigger.activate, release=version)
    return Done(f"activated {version} without judgment: all assets written, "
                f"{node.paths.agent_unit_name} restarted{_on_path(node)}", doc.state)


def _on_path(node: Node) -> str:
    """How `agent-fsm` on PATH stands after the assets were written (`bin_link`)."""
    link = bin_link.look(node.paths)
    if link.path is None:
        return ""
    if link.state == "ok":
        return f"; agent-fsm on PATH: {link.words()}"
    return f"; {link.words()}"


def wait_for_recovery(node: Node, timeout: float | None = None,
                      on_wait: Callable[[str], None] | None = None, poll: float = 0.5) -> float:
    """Wait, at most `timeout` seconds (RECOVERY_WAIT if None), while the recovery unit is at
    work, which `begin_upgrade` refuses (`recovery_idle`); `on_wait(its state)` once, when it
    is. Returns the seconds waited. A recovery unit that outlives an upgrade is one whose try
    failed and tries again: its next try finds nothing pending and ends it, so an upgrade
    begun right after a rollback (or just after the fault that failed the try) waits a little
    instead of being refused."""
    limit = RECOVERY_WAIT if timeout is None else timeout
    t0 = time.monotonic()
    told = False
    while (now := units.recovery_at_work(node.effectors)) is not None:
        if not told and on_wait is not None:
            on_wait(now)
        told = True
        if time.monotonic() - t0 >= limit:
            break
        time.sleep(poll)
    return time.monotonic() - t0 if told else 0.0


def begin_upgrade(node: Node, version: str, *, force: bool = False) -> StateDoc:
    """Start an upgrade; `force` goes past a hold and inhibitors (the definition's conditions
    read it as the step's `force` argument)."""
    # The candidate is checked where a condition finds it and where it is selected: one walk
    # of its tree serves both (the command runs on the critical path of every upgrade).
    with node.releases.checked_once():
        return node.controller.fire(Trigger.begin_upgrade, release=version,
                                    **({"force": True} if force else {}))


def why_recover(node: Node, doc: StateDoc) -> dict[str, str]:
    """Why this rollback of the upgrade `doc` knows, as the result records it: its signal lost
    (gone, unreadable: the candidate was never judged); else the recovery unit (its
    environment says so) reads the agent unit's end from systemd; anyone else is an operator.
    Never raises: the way back does not wait on systemd's answer nor on the signal."""
    try:  # the start check's count: a damaged signal never stops a rollback
        sig = node.signal()
    except AgentFsmError as exc:
        return reasons.signal_lost(doc.state, str(exc))
    if sig is None:
        return reasons.signal_lost(doc.state, f"{node.paths.signal_file} is gone")
    if os.environ.get(reasons.RECOVERY_ENV) != "unit":
        return {"reason": "rolled back by hand with `agent-fsm recover`", "reason_class": "manual"}
    unit = node.paths.agent_unit_name
    try:
        shown = node.effectors.systemd.show(unit, reasons.PROPERTIES)
    except AgentFsmError:
        shown = {}
    most = node.config.judgment.max_attempts
    refused = most if sig.starts > most else None
    reason, why = reasons.from_unit(unit, shown, refused)
    return {"reason": reason, "reason_class": why}


# The way back waits for the writers' lock rather than give up after the store's 30 s: an
# operator's command holds it only to commit (`release add` stages outside it), and the
# recovery unit's start timeout (120 s) still bounds a try.
WAY_BACK_LOCK_WAIT = 60.0
# How long a failed try of the recovery unit waits before it exits for systemd to start it
# again: RETRY_FIRST, doubled with each of the unit's restarts, at most RETRY_MAX.
RETRY_FIRST = 2.0
RETRY_MAX = 30.0
# How long `upgrade` waits for a recovery unit still at work (`wait_for_recovery`): its longest
# wait between tries, its RestartSec= (1 s) and a try that finds nothing pending.
RECOVERY_WAIT = RETRY_MAX + 15.0


def recover(node: Node) -> Done:
    """Roll back to the last-good when an upgrade is pending and not judged ok; else say so.
    Raises when the rollback is not done (the recovery unit then tries again)."""
    node.store.lock_timeout = max(node.store.lock_timeout, WAY_BACK_LOCK_WAIT)
    doc = node.store.read()
    cleared = way_back.clear_leftovers(node, doc, way_back.RECOVER)
    if cleared.ended_by == way_back.Leftover.cut_upgrade:
        # An upgrade cut before its candidate started: never finish it (the way back never
        # runs the candidate's path) nor mark a version that never ran.
        _restart_refused(node, f"the upgrade{_to(doc)} was abandoned")
        return Done(f"the upgrade{_to(doc)} was abandoned before its candidate started: "
                    f"last-good {node.releases.last_good()} selected, nothing marked known "
                    f"bad, {node.paths.agent_unit_name} restarted", cleared.doc.state)
    if (sig := cleared.signal) is not None:
        _restart_refused(node, f"rolled back to last-good {node.releases.last_good()}")
        return Done(f"an upgrade signal ({sig.from_version} → {sig.to_version}) exists but the "
                    f"state file knew no upgrade: the candidate was never judged here; rolling "
                    f"back to last-good {node.releases.last_good()}: selected, "
                    f"{node.paths.agent_unit_name} restarted", cleared.doc.state)
    doc = cleared.doc
    return ON_RECOVER[node.definition.state(doc.state).on_recover](node, doc)


def _to(doc: StateDoc) -> str:
    owed = doc.pending.args.get("release") if doc.pending is not None else None
    return f" to {owed}" if owed else ""


def retry_delay(node: Node | None) -> float:
    """The wait before a failed try of the recovery unit exits: RETRY_FIRST doubled with each
    restart systemd counted (`NRestarts` of the recovery unit), at most RETRY_MAX; RETRY_MAX
    when the node or systemd cannot say (a wrong config, a failing systemctl)."""
    if node is None:
        return RETRY_MAX
    try:
        shown = node.effectors.systemd.show(node.paths.recovery_unit_name, ("NRestarts",))
        restarts = int(shown.get("NRestarts", ""))
    except (AgentFsmError, ValueError):
        return RETRY_MAX
    return min(RETRY_FIRST * 2.0 ** min(max(restarts, 0), 16), RETRY_MAX)


def _roll_back(node: Node, doc: StateDoc) -> Done:
    doc = node.controller.fire(Trigger.recover, **why_recover(node, doc))
    _restart_refused(node, f"rolled back to last-good {node.releases.last_good()}")
    return Done(f"rolling back to last-good {node.releases.last_good()}: selected, "
                f"start limit reset, {node.paths.agent_unit_name} restarted", doc.state)


def _restart_refused(node: Node, done: str) -> None:
    """Raise when systemd refused the restart the way back just asked for: the agent unit is
    `failed` (a unit with a start limit, hit, where the reset before the restart failed:
    `reset_start_limit` is let pass; a restart job with no process to stop runs at once). The
    recovery unit then tries again, and its next `recover` resets and restarts: its own run
    was the one `OnFailure=` would have started, so nothing else would (found by the model
    check). An operator's run is not asked (the failure starts the recovery unit, which does
    the same); where systemd cannot say, the rollback is taken as done, as `why_recover` does."""
    if os.environ.get(reasons.RECOVERY_ENV) != "unit":
        return
    unit = node.paths.agent_unit_name
    try:
        shown = node.effectors.systemd.show(unit, ("ActiveState", "Result"))
    except AgentFsmError:
        return
    if shown.get("ActiveState") == "failed":
        raise SystemdError(f"{done}, but systemd did not start {unit}: it is failed (result "
                           f"{shown.get('Result') or '?'}), its start limit not reset; run "
                           "`agent-fsm recover` again (the recovery unit does)")


def _nothing_completing(node: Node, doc: StateDoc) -> Done:
    return Done("nothing to roll back: the upgrade was judged ok and is completing"
                + _started_if_given_up(node), doc.state)


def _nothing_pending(node: Node, doc: StateDoc) -> Done:
    return Done("nothing to roll back: no upgrade is pending" + _started_if_given_up(node),
                doc.state)


def _started_if_given_up(node: Node) -> str:
    """With nothing to roll back, the agent's next start does what is left (a judged-ok
    candidate's `complete`, a converged agent's `settle`), and a converged agent is restarted
    for ever. Unless systemd gave up starting it: a unit with a start limit (the unit older
    releases wrote, `StartLimitBurst=max_attempts` in 300 s, still loaded where a `complete`'s
    reload failed; a drop-in) is left `failed` (start-limit-hit) for good once its starts are
    used up. Then its start limit is reset and it is started again, as the way back does
    (found by the model check); what is done, in words for the message. Where systemd cannot
    say, the recovery unit's run raises (it is tried again: it runs because the agent unit
    failed), an operator's is told."""
    unit = node.paths.agent_unit_name
    try:
        shown = node.effectors.systemd.show(unit, ("ActiveState", "Result"))
    except AgentFsmError as exc:
        if os.environ.get(reasons.RECOVERY_ENV) == "unit":
            raise
        log.warning("could not ask systemd whether %s failed: %s", unit, exc)
        return ""
    if shown.get("ActiveState") != "failed":
        return ""
    node.effectors.systemd.reset_failed(unit)
    node.effectors.systemd.start(unit)
    return (f"; {unit} had failed (result {shown.get('Result') or '?'}): start limit reset and "
            f"{unit} started again")


# What `recover` does from each state, by its `on_recover` in states/agent-upgrade.toml.
ON_RECOVER: Mapping[OnRecover, Callable[[Node, StateDoc], Done]] = handlers(OnRecover, {
    OnRecover.roll_back: _roll_back,
    OnRecover.nothing_completing: _nothing_completing,
    OnRecover.nothing_pending: _nothing_pending,
}, "`agent-fsm recover`")


@dataclass(frozen=True)
class UpgradeOutcome:
    to_version: str
    outcome: str  # "ok" or "rolled_back"
    passed: tuple[tuple[float, str, str], ...]  # (time, trigger, state) in the order seen


def follow(node: Node, started: float, to_version: str, timeout: float,
           on_state: Callable[[float, str, str], None] = lambda _t, _tr, _s: None,
           interval: float = 0.02, reread: float = 0.5) -> UpgradeOutcome:
    """Watch an upgrade (by reading, never locking) until it converges; report its outcome.

    The state file and the gate are looked at (one stat each) every `interval` seconds and the
    state read when either changed, or `reread` seconds after the last read whatever they show:
    the end is noticed within milliseconds at the cost of a read per transition.
    """
    end = time.monotonic() + timeout
    seen: list[tuple[float, str, str]] = []
    while True:
        mark = _mark(node)
        last_read = time.monotonic()
        doc = node.store.read()
        for entry in node.store.history(doc):
            step = (entry["time"], entry["trigger"], entry["to"])
            if entry["time"] >= started and step not in seen:
                seen.append(step)
                on_state(*step)
        result: dict[str, Any] | None = doc.last_result
        if (doc.state == StateName.converged and doc.pending is None and result is not None
                and result.get("to") == to_version and result.get("started", 0) >= started
                and node.gate.is_open()):
            return UpgradeOutcome(to_version, str(result["outcome"]), tuple(seen))
        if time.monotonic() > end:
            raise AgentFsmError(
                f"the upgrade to {to_version} did not finish within {timeout:g}s (state "
                f"{doc.state}); it goes on: follow it with `agent-fsm status`"
            )
        while (_mark(node) == mark and time.monotonic() - last_read < reread
               and time.monotonic() <= end):
            time.sleep(interval)


def _mark(node: Node) -> tuple[tuple[int, int, int] | None, ...]:
    """What a change of the state file or the gate changes (a write replaces the state file)."""
    out: list[tuple[int, int, int] | None] = []
    for path in (node.paths.state_file, node.paths.gate_file):
        try:
            st = path.stat()
        except FileNotFoundError:
            out.append(None)
        else:
            out.append((st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(out)
