"""`agent-fsm recover`: roll back to the last-good when an upgrade is pending and not judged ok.

`recover` is the use case; `run` the process. It hands over to the last-good's `agent-fsm` when
this is another release's. Under the recovery unit it turns a failed try into a wait and an exit
code, so systemd tries again.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..errors import AgentFsmError, SystemdError
from ..machine.definition import OnRecover, handlers
from ..machine.vocabulary import Trigger
from ..node.state import reasons
from ..node.state.store import StateDoc
from ..upgrade import way_back
from ..wiring import Node
from .operations import Done

log = logging.getLogger("agent_fsm")


def by_recovery_unit() -> bool:
    """Whether the recovery unit runs this process: it sets AGENT_FSM_RECOVERY=unit."""
    return os.environ.get(reasons.RECOVERY_ENV) == "unit"


def why_recover(node: Node, doc: StateDoc, *, by_unit: bool = False) -> dict[str, str]:
    """Why this rollback happens, as the result records it; never raises or waits.

    A lost signal: never judged. Else the recovery unit reads the agent unit's end from systemd;
    anyone else is an operator.
    """
    try:  # the start check's count: a damaged signal never stops a rollback
        sig = node.signal()
    except AgentFsmError as exc:
        return reasons.signal_lost(doc.state, str(exc))
    if sig is None:
        return reasons.signal_lost(doc.state, f"{node.paths.signal_file} is gone")
    if not by_unit:
        return {"reason": "rolled back by hand with `agent-fsm recover`",
                "reason_class": reasons.ReasonClass.manual}
    unit = node.paths.agent_unit_name
    try:
        shown = node.effectors.systemd.show(unit, reasons.PROPERTIES)
    except AgentFsmError:
        shown = {}
    most = node.config.judgment.max_attempts
    refused = most if sig.starts > most else None
    reason, why = reasons.from_unit(unit, shown, refused, sig.timeouts)
    return {"reason": reason, "reason_class": why}


# The way back waits for the writers' lock rather than give up after the store's 30 s: an
# operator's command holds it only to commit (`release add` stages outside it), and the
# recovery unit's start timeout (120 s) still bounds a try.
WAY_BACK_LOCK_WAIT = 60.0
# How long a failed try of the recovery unit waits before it exits for systemd to start it
# again: RETRY_FIRST, doubled with each of the unit's restarts, at most RETRY_MAX.
RETRY_FIRST = 2.0
RETRY_MAX = 30.0


def recover(node: Node, *, by_unit: bool = False) -> Done:
    """Roll back when an upgrade is pending and not judged ok; else say so. Raises if not done."""
    node.store.lock_timeout = max(node.store.lock_timeout, WAY_BACK_LOCK_WAIT)
    doc = node.store.read()
    cleared = way_back.clear_leftovers(node, doc, way_back.RECOVER)
    if cleared.ended_by == way_back.Leftover.cut_upgrade:
        # An upgrade cut before its candidate started: never finish it (the way back never
        # runs the candidate's path) nor mark a version that never ran.
        _restart_refused(node, f"the upgrade{_to(doc)} was abandoned", by_unit=by_unit)
        return Done(f"the upgrade{_to(doc)} was abandoned before its candidate started: "
                    f"last-good {node.releases.last_good()} selected, nothing marked known "
                    f"bad, {node.paths.agent_unit_name} restarted", cleared.doc.state)
    if (sig := cleared.signal) is not None:
        _restart_refused(node, f"rolled back to last-good {node.releases.last_good()}",
                         by_unit=by_unit)
        return Done(f"an upgrade signal ({sig.from_version} → {sig.to_version}) exists but the "
                    f"state file knew no upgrade: the candidate was never judged here; rolling "
                    f"back to last-good {node.releases.last_good()}: selected, "
                    f"{node.paths.agent_unit_name} restarted", cleared.doc.state)
    doc = cleared.doc
    return ON_RECOVER[node.definition.state(doc.state).on_recover](node, doc, by_unit)


def _to(doc: StateDoc) -> str:
    owed = doc.pending.args.get("release") if doc.pending is not None else None
    return f" to {owed}" if owed else ""


def retry_delay(node: Node | None) -> float:
    """The wait before a failed recovery try exits: RETRY_FIRST doubled per restart, at most RETRY_MAX."""
    if node is None:
        return RETRY_MAX
    try:
        shown = node.effectors.systemd.show(node.paths.recovery_unit_name, ("NRestarts",))
        restarts = int(shown.get("NRestarts", ""))
    except (AgentFsmError, ValueError):
        return RETRY_MAX
    return min(RETRY_FIRST * 2.0 ** min(max(restarts, 0), 16), RETRY_MAX)


def _roll_back(node: Node, doc: StateDoc, by_unit: bool) -> Done:
    # The last-good is checked where it is selected and where the way back makes sure it can
    # run: one walk of its tree serves both.
    with node.releases.checked_once():
        doc = node.controller.fire(Trigger.recover, **why_recover(node, doc, by_unit=by_unit))
    _restart_refused(node, f"rolled back to last-good {node.releases.last_good()}",
                     by_unit=by_unit)
    return Done(f"rolling back to last-good {node.releases.last_good()}: selected, "
                f"start limit reset, {node.paths.agent_unit_name} restarted", doc.state)


def _restart_refused(node: Node, done: str, *, by_unit: bool) -> None:
    """Raise when systemd refused the way back's restart, leaving the agent unit `failed`.

    That is a start limit hit whose reset failed. The recovery unit's next try resets and
    restarts; nothing else would. An operator's run is not asked. Where systemd cannot say, it
    counts as done.
    """
    if not by_unit:
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


def _nothing_completing(node: Node, doc: StateDoc, by_unit: bool) -> Done:
    return Done("nothing to roll back: the upgrade was judged ok and is completing"
                + _started_if_given_up(node, by_unit=by_unit), doc.state)


def _nothing_pending(node: Node, doc: StateDoc, by_unit: bool) -> Done:
    return Done("nothing to roll back: no upgrade is pending"
                + _started_if_given_up(node, by_unit=by_unit), doc.state)


def _started_if_given_up(node: Node, *, by_unit: bool) -> str:
    """Start the agent unit again if systemd gave up starting it; what was done, in words.

    A unit with a start limit (an older release's, a drop-in) stays `failed` once its starts are
    used up; its limit is reset and it is started. Where systemd cannot say, the recovery unit's
    run raises; an operator's is told.
    """
    unit = node.paths.agent_unit_name
    try:
        shown = node.effectors.systemd.show(unit, ("ActiveState", "Result"))
    except AgentFsmError as exc:
        if by_unit:
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
ON_RECOVER: Mapping[OnRecover, Callable[[Node, StateDoc, bool], Done]] = handlers(OnRecover, {
    OnRecover.roll_back: _roll_back,
    OnRecover.nothing_completing: _nothing_completing,
    OnRecover.nothing_pending: _nothing_pending,
}, "`agent-fsm recover`")


@dataclass(frozen=True)
class Tried:
    """One run of `agent-fsm recover`: what it did, or why it failed and how long to wait before exit."""

    done: Done | None
    failure: Exception | None = None
    retry_in: float = 0.0

    @property
    def exit_code(self) -> int:
        """0 when done; else non-zero, so that systemd's `Restart=on-failure` tries again."""
        if self.failure is None:
            return 0
        code = self.failure.exit_code if isinstance(self.failure, AgentFsmError) else 1
        return code or 1

    def hold_off(self) -> None:
        time.sleep(self.retry_in)


def run(open_node: Callable[[], Node], global_options: Sequence[str],
        tell: Callable[[str], None]) -> Tried:
    """`agent-fsm recover` as a process runs it, its node opened by `open_node`.

    By hand, a failure is raised. Under the recovery unit it is returned with its wait, so the
    unit tries again until the rollback is done.
    """
    by_unit = by_recovery_unit()
    if not by_unit:
        return Tried(_run(open_node(), global_options, tell, by_unit=False))
    node: Node | None = None
    try:
        node = open_node()
        return Tried(_run(node, global_options, tell, by_unit=True))
    except Exception as exc:  # whatever failed, the rollback is tried again
        return Tried(None, exc, retry_delay(node))


def _run(node: Node, global_options: Sequence[str], tell: Callable[[str], None], *,
         by_unit: bool) -> Done:
    from ..node.config_fallback import tell_fallback

    hand_over(node, global_options, tell)
    tell_fallback(node.config)
    return recover(node, by_unit=by_unit)


def hand_over(node: Node, global_options: Sequence[str], tell: Callable[[str], None]) -> None:
    """Run the last-good's own `agent-fsm recover` with `global_options` when this is another release's.

    Only the last-good's code runs the way back, and `agent-fsm` on PATH is the selected
    release's. Returns when this is the last-good's, runs from no stored release, or there is no
    launcher.
    """
    process = node.controller.process
    last_good = node.releases.last_good()
    if process is None or process.release is None or last_good is None \
            or last_good == process.release:
        return
    launcher = node.releases.path(last_good) / "bin" / "agent-fsm"
    if not os.access(launcher, os.X_OK):
        return  # the engine refuses what is not this release's to run, saying so
    tell(f"<6>handing over to the last-good's {launcher}: this agent-fsm is release "
         f"{process.release}'s")
    os.execv(launcher, [str(launcher), *global_options, Trigger.recover.value])
