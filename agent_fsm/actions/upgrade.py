"""`agent-fsm upgrade --to V [--wait]`: begin an upgrade, and follow it to its judgment.

`upgrade` says what `--force` goes past, begins the upgrade (once a recovery unit still at work is
done, when that refused it) and, asked to, follows it. It tells each step as it happens (`Step`),
where a followed upgrade is at each read (`Progress`), and returns what happened (`Upgraded`).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from ..errors import AgentFsmError, Refused, SignalError, StateFileError
from ..machine.vocabulary import StateName, Trigger
from ..node.runtime import judgment
from ..node.runtime.signal import UpgradeSignal
from ..node.state.store import StateDoc
from ..upgrade import units
from ..wiring import Node
from .recover import RETRY_MAX

# How long `upgrade` waits for a recovery unit at work: its longest wait between tries, its
# RestartSec= (1 s) and a try that finds nothing pending.
RECOVERY_WAIT = RETRY_MAX + 15.0


def wait_for_recovery(node: Node, timeout: float | None = None,
                      on_wait: Callable[[str], None] | None = None, poll: float = 0.5) -> float:
    """Wait at most `timeout` seconds (None: RECOVERY_WAIT) while the recovery unit is at work,
    which `begin_upgrade` refuses; call `on_wait(its state)` once if it is. Returns the seconds
    waited.

    A recovery unit outlives an upgrade when its try failed: its next try finds nothing pending and
    ends it. So an upgrade begun right after a rollback waits a little instead of being refused.
    """
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


def begin_upgrade(node: Node, version: str, *, force: bool = False,
                  channel: dict[str, Any] | None = None) -> StateDoc:
    """Start an upgrade. `force` goes past a hold and inhibitors (the conditions read it as the
    step's `force` argument); `channel` ({name, index_version}, from `follow`) is kept with the
    upgrade and named by its result."""
    # A condition and the selection both check the candidate: one walk of its tree serves both, on
    # the critical path of every upgrade.
    with node.releases.checked_once():
        return node.controller.fire(Trigger.begin_upgrade, release=version,
                                    **({"force": True} if force else {}),
                                    **({} if channel is None else {"channel": channel}))


@dataclass(frozen=True)
class UpgradeOutcome:
    to_version: str
    outcome: str  # "ok" or "rolled_back"
    passed: tuple[tuple[float, str, str], ...]  # (time, trigger, state) in the order seen
    reason: str = ""  # the result's, as `status` has it
    reason_class: str = ""


class Phase(enum.StrEnum):
    """Where a followed upgrade is, as read from the state file and the signal."""

    starting = "candidate starting"  # its start not counted yet
    judging = "judging"  # attempt N of M: its checks
    soaking = "soaking"  # its checks passed; it must stay up the soak
    publishing = "publishing"  # judged ok; its result is published before the gate opens
    rolling_back = "rolling back"  # judged failed, or the way back under way
    converged = StateName.converged.value
    rolled_back = "rolled back"
    other = "other"  # a state no upgrade passes through (`Progress.state` names it)


@dataclass(frozen=True)
class Progress:
    """Where the followed upgrade is at one read.

    `time` is the wall clock, `after` the seconds since it began. `attempt` is 0 before the first
    start is counted. `deadline_in` is the seconds left to the attempt's deadline, None without a
    signal. `answers` and `soak_left` are what the judging daemon recorded
    (`node.runtime.judgment`).
    """

    time: float
    after: float
    phase: Phase
    state: str
    to_version: str
    attempt: int
    max_attempts: int
    deadline_in: float | None
    answers: tuple[judgment.Answer, ...] = ()  # each check's last answer, as the daemon said
    soak_left: float | None = None  # seconds, once the soak began


_PHASES: dict[str, Phase] = {StateName.judged_ok: Phase.publishing,
                             StateName.judged_failed: Phase.rolling_back,
                             StateName.recovering: Phase.rolling_back}


_ENDS: dict[str | None, Phase] = {Trigger.complete: Phase.converged,
                                  Trigger.complete_queued: Phase.converged,
                                  Trigger.recovered: Phase.rolled_back}


def _phase(state: str, trigger: str | None, attempt: int) -> Phase:
    """The phase of `state`, entered by `trigger` (None: found by a read)."""
    if state == StateName.candidate_running:
        judged = attempt or trigger == Trigger.candidate_started
        return Phase.judging if judged else Phase.starting
    if state == StateName.converged:
        return _ENDS.get(trigger, Phase.other)
    return _PHASES.get(state, Phase.other)


def _signal(node: Node) -> UpgradeSignal | None:
    try:
        return node.signal()
    except SignalError:
        return None


def _at(when: float, phase: Phase, state: str, attempt: int, *, started: float,
        to_version: str, max_attempts: int, left: float | None,
        judged: judgment.Record | None) -> Progress:
    if phase is not Phase.judging or judged is None or judged.attempt != attempt \
            or judged.version != to_version:
        return Progress(when, when - started, phase, state, to_version, attempt, max_attempts,
                        left)
    soak = None if judged.soak_ends is None else max(judged.soak_ends - when, 0.0)
    return Progress(when, when - started, Phase.soaking if soak is not None else phase, state,
                    to_version, attempt, max_attempts, left, judged.answers, soak)


def follow(node: Node, started: float, to_version: str, timeout: float,
           on_state: Callable[[float, str, str], None] = lambda _t, _tr, _s: None,
           interval: float = 0.02, reread: float = 0.5,
           on_progress: Callable[[Progress], None] = lambda _p: None) -> UpgradeOutcome:
    """Watch an upgrade, reading and never locking, until it converges; return its outcome.

    `on_state` gets each transition seen, `on_progress` where it is at each read. Every `interval`
    seconds the state file and the gate are stat'ed. The state is read when either changed, or
    `reread` seconds after the last read. So the end is noticed within milliseconds, at the cost of
    a read per transition.
    """
    end = time.monotonic() + timeout
    seen: list[tuple[float, str, str]] = []
    starts = 0  # the candidate's starts seen
    max_attempts = node.config.judgment.max_attempts
    while True:
        mark = _mark(node)
        last_read = time.monotonic()
        doc = node.store.read()
        sig, now = _signal(node), time.time()
        left = None if sig is None else sig.deadline - now
        at = partial(_at, started=started, to_version=to_version, max_attempts=max_attempts,
                     left=left, judged=judgment.read(node.paths) if sig is not None else None)
        for entry in node.store.history(doc):
            step = (entry["time"], entry["trigger"], entry["to"])
            if entry["time"] >= started and step not in seen:
                seen.append(step)
                on_state(*step)
                starts += entry["trigger"] == Trigger.candidate_started
                attempt = max(starts, sig.attempt if sig is not None else 0)
                on_progress(at(step[0], _phase(step[2], step[1], attempt), step[2], attempt))
        result: dict[str, Any] | None = doc.last_result
        attempt = sig.attempt if sig is not None else 0
        if (doc.state == StateName.converged and doc.pending is None and result is not None
                and result.get("to") == to_version and result.get("started", 0) >= started
                and node.gate.is_open()):
            outcome = str(result["outcome"])
            on_progress(at(now, Phase.converged if outcome == "ok" else Phase.rolled_back,
                           doc.state, attempt))
            return UpgradeOutcome(to_version, outcome, tuple(seen),
                                  str(result.get("reason") or ""),
                                  str(result.get("reason_class") or ""))
        entered = seen[-1][1] if seen and seen[-1][2] == doc.state else None
        on_progress(at(now, _phase(doc.state, entered, attempt), doc.state, attempt))
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


@dataclass(frozen=True)
class Waiting:
    """The recovery unit is still at work for the last upgrade: the upgrade waits for it."""

    unit: str
    state: str
    limit: float  # at most this long; then `begin_upgrade` refuses


@dataclass(frozen=True)
class Forced:
    """What `--force` goes past (a hold, an inhibitor, a known-bad mark), said before it."""

    what: str


@dataclass(frozen=True)
class Began:
    from_version: str
    to_version: str


@dataclass(frozen=True)
class Passed:
    """A transition of the upgrade followed (`--wait`), `after` seconds after it began."""

    after: float
    trigger: str
    state: str


Step = Waiting | Forced | Began | Passed | Progress


@dataclass(frozen=True)
class Upgraded:
    """What `upgrade` did: the upgrade it began and, when followed, its outcome."""

    from_version: str
    to_version: str
    outcome: str | None  # "ok" or "rolled_back"; None when not followed
    reason: str = ""  # when followed: the result's reason and class, as `status` has them
    reason_class: str = ""


def _begun(node: Node, to: str, *, force: bool, channel: dict[str, Any] | None,
           tell: Callable[[Step], None]) -> StateDoc:
    """`begin_upgrade`; refused while the recovery unit is at work, once it is done, again.

    Its condition asks systemd under the lock. Asking first as well would cost every upgrade a
    `systemctl show` for what follows only a failed rollback's try."""
    try:
        return begin_upgrade(node, to, force=force, channel=channel)
    except Refused:
        if units.recovery_at_work(node.effectors) is None:
            raise
    recovery = node.paths.recovery_unit_name
    wait_for_recovery(node, on_wait=lambda now: tell(Waiting(recovery, now, RECOVERY_WAIT)))
    return begin_upgrade(node, to, force=force, channel=channel)


def upgrade(node: Node, to: str, *, wait: bool = False, timeout: float = 600.0,
            force: bool = False, tell: Callable[[Step], None] = lambda _step: None,
            channel: dict[str, Any] | None = None) -> Upgraded:
    """Begin the upgrade to `to` once no recovery unit is at work; with `wait`, follow it to its
    judgment for at most `timeout` seconds, telling each step as it happens."""
    if force:
        from ..upgrade.overrides import passed

        for what in passed(node.paths, node.clock.now(), to):
            tell(Forced(what))
    doc = _begun(node, to, force=force, channel=channel, tell=tell)
    up = doc.upgrade
    if up is None:
        raise StateFileError(f"the upgrade to {to} began, but the state file {node.paths.state_file} "
                             "names no upgrade; run `agent-fsm status`")
    tell(Began(up.from_version, up.to_version))
    if not wait:
        return Upgraded(up.from_version, to, None)
    t0 = up.started
    result = follow(node, up.started, to, timeout, on_state=lambda when, trigger, state: tell(
        Passed(when - t0, trigger, state)), on_progress=tell)
    return Upgraded(up.from_version, to, result.outcome, result.reason, result.reason_class)
