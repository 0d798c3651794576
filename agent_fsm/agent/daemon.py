"""The daemon the agent unit runs: resume, judge or converge, open the gate, then READY=1.

A start first clears what the way back finds left (`upgrade.way_back`: a cut upgrade, an owed
transition, an orphaned signal). Then it does the state's `on_start` (states/agent-upgrade.toml,
ON_START). Judging a candidate: hold the last-good's assets, count the attempt, judge. Ok: publish,
clear the signal, write its assets, reload, promote, open the gate. Failed: record the result, keep
the signal, start the recovery unit, exit 1. A candidate without a readable signal is not judged: it
starts the recovery unit and exits 1. SIGTERM during the judgment is no verdict. Nothing is recorded
and the exit is 0; the next start judges again, one more attempt counted, as after a power cut.

Only the last-good's code runs the way back. The engine refuses (NotItsRole), touching nothing, a
transition that is not this process's role (`by` in states/, `upgrade.roles`). The daemon then hands
over. With another release selected it restarts its own unit and waits for the stop; else it starts
the recovery unit and exits 1.

READY=1 follows the start's work, so TimeoutStartSec bounds the judgment. Then the daemon keeps the
follow timer (never before the gate opens) and supervises the workload (`supervision.py`). It pings
the watchdog, and finishes what a dead command left (`dead_command.py`). On SIGTERM it says
STOPPING=1 and exits 0. Signal handlers only set flags; waits are on a wake-up pipe.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Mapping

from ..errors import AgentFsmError, NotItsRole, ReleaseError, SignalError, StopRequested
from ..machine.definition import OnStart, Role, handlers
from ..machine.vocabulary import Trigger
from ..node.runtime import judgment as judgment_record
from ..node.runtime.signal import UpgradeSignal
from ..node.state.reasons import ReasonClass
from ..node.state.store import OWED_CHECK_SECONDS, StateDoc
from ..system.notify import Notifier, watchdog_interval
from ..upgrade import follow_timer, way_back
from ..upgrade.releases import way_back as way_back_release
from ..wiring import Node
from . import judge as judge_mod
from .dead_command import STOP_GRACE, DeadCommand, Looks
from .publishing import PUBLISH_RETRY_FIRST, PUBLISH_RETRY_MAX, open_gate_after_judgment
from .runtime import Waker, WakerClock, return_free_memory, setup_logging
from .supervision import Workload, release_env

log = logging.getLogger("agent_fsm")

DELIVERY_RETRY_MAX = 300.0


class Daemon:
    def __init__(self, node: Node, notifier: Notifier, waker: Waker) -> None:
        self.node = node
        self.notifier = notifier
        self.waker = waker
        self.clock = WakerClock(waker)
        self.workload = Workload(node, notifier)
        self.retry_delay = PUBLISH_RETRY_FIRST / 2
        process = node.controller.process
        # The release this process runs (fixed at its start); None: not checked (tests).
        self.release = None if process is None else process.release
        self.dead_command = DeadCommand(node, self.release, notifier, self.workload)

    # Startup ----------------------------------------------------------------------------
    def status(self, text: str) -> None:
        log.info("%s", text)
        self.notifier.status(text)

    def extend_start(self, tries: int, why: str) -> None:
        """Before each try to publish a judged-ok result, extend systemd's start timeout by the
        publish command's timeout and a margin."""
        room = float(getattr(self.node.effectors.publisher, "timeout", 30.0)) + PUBLISH_RETRY_MAX + 10
        text = ("publishing the result before opening the gate" if tries == 1 else
                f"publishing the result failed, try {tries}: {why}")
        self.notifier.extend_timeout(room, text)

    def deliver_results(self) -> float | None:
        """Deliver queued results (a rolled-back one, say); None when the outbox is empty, else the
        seconds until the next try. Never blocks the way back."""
        try:
            delivered = self.node.effectors.publisher.deliver()
        except AgentFsmError as exc:
            self.retry_delay = min(self.retry_delay * 2, DELIVERY_RETRY_MAX)
            log.warning("delivering a recorded result failed, retrying in %.0fs: %s",
                        self.retry_delay, exc)
            return self.retry_delay
        if delivered:
            log.info("delivered %d recorded result(s)", delivered)
        self.retry_delay = PUBLISH_RETRY_FIRST / 2
        return None

    def startup(self) -> bool:
        """Bring the node to an open gate; False when this process must exit non-zero."""
        try:
            return self._startup()
        except NotItsRole as exc:
            return self.not_its_turn(exc)

    def not_its_turn(self, exc: NotItsRole) -> bool:
        """The state is another role's to change: leave it and hand over.

        With another release selected, restart this unit for it and wait for the stop (exit 0, so no
        `OnFailure=` on systemd >= 255; exit 1 if no stop comes, and `Restart=` starts the
        selected). With this one selected, the way back is the last-good's: start the recovery unit
        and exit 1.
        """
        self.workload.stop()
        log.error("%s", exc)
        self.notifier.status(f"not this process's to run: {exc.trigger}; handing over")
        node = self.node
        selected = node.releases.selected()
        if self.release is not None and selected not in (None, self.release):
            log.warning("release %s is selected: restarting %s so that its start takes over",
                        selected, node.paths.agent_unit_name)
            try:
                node.effectors.systemd.restart(node.paths.agent_unit_name)
            except AgentFsmError as err:
                if self.waker.stop:  # a stop came first (a restart queued by `recover`)
                    return True
                log.error("%s; exiting so that systemd starts %s", err, selected)
                return False
            return self._stop_follows(STOP_GRACE)
        log.warning("starting %s: the way back is the last-good's to run",
                    node.paths.recovery_unit_name)
        node.effectors.systemd.start(node.paths.recovery_unit_name)
        return False

    def _startup(self) -> bool:
        node = self.node
        # An upgrade cut before its candidate started: the last-good abandons it. Finishing it would
        # let the way back, queued by the failure that cut it, roll back and mark a version that
        # never ran. This start is the last-good's: no restart; the gate opens below.
        doc = node.store.read()
        cleared = way_back.clear_leftovers(node, doc, way_back.START, abandon=self._last_good(doc))
        if cleared.ended_by is not None:  # an orphan rolled back: the restart queued stops us
            return self._stop_follows(STOP_GRACE)
        selected = node.releases.selected()
        if selected is None:  # nothing to start, whatever the state says
            return self.refuse_not_installed()
        doc = cleared.doc
        return ON_START[node.definition.state(doc.state).on_start](self, doc, selected)

    def _last_good(self, doc: StateDoc) -> bool:
        """Whether this process runs the last-good's code (without roles, in tests: whether the
        last-good is selected)."""
        releases = self.node.releases
        process = self.node.controller.process
        if process is not None:
            return process.role(doc) == Role.last_good
        return releases.last_good() is not None and releases.selected() == releases.last_good()

    # What a start does, by the state's `on_start` (ON_START below) ---------------------
    def refuse_not_installed(self, *_: object) -> bool:
        log.error("nothing is installed: run `agent-fsm install --version V` first")
        return False

    def judge_candidate(self, doc: StateDoc, version: str) -> bool:
        controller = self.node.controller
        if isinstance(sig := self._signal(), str):
            return self.not_judged(doc, version, sig)
        controller.fire(Trigger.candidate_started)
        if isinstance(sig := self._signal(), str):
            return self.not_judged(doc, version, sig)
        self.status(f"judging candidate {version} (attempt {sig.attempt}); holding the "
                    "last-good's assets")
        judgment = self.node.config.judgment
        release_dir = self.node.releases.path(version)  # the store's paths: checks run as root
        env = release_env(version, release_dir, release_dir / "payload")
        verdict = judge_mod.Verdict(False, "not judged")
        try:
            self.workload.start(version)
            verdict = judge_mod.judge(
                judgment, attempt=sig.attempt, clock=self.clock,
                check=lambda spec, timeout: judge_mod.run_check(spec, env, timeout),
                alive=self.workload.alive, exited=self.workload.exit_reason,
                stopping=lambda: self.waker.stop,
                told=judgment_record.teller(self.node.paths, version, sig.attempt))
        except AgentFsmError as exc:
            verdict = judge_mod.Verdict(False, str(exc), ReasonClass.crashed)
        if not verdict.ok and self._stopped(verdict):
            # No verdict: keep the signal, record and mark nothing; the next start judges again, an
            # attempt counted, as after a power cut.
            log.warning("stopped while judging candidate %s (%s): no verdict; the signal stays "
                        "and the next start judges it again", version, verdict.reason)
            self.workload.stop()
            return True
        if verdict.ok and isinstance(lost := self._signal(), str):
            self.workload.stop()
            return self.not_judged(doc, version, lost)
        if verdict.ok:
            self.status(f"candidate {version} judged ok: {verdict.reason}")
            controller.fire(Trigger.judge_ok)
            self.publish_and_open_gate()
            return True
        log.error("candidate %s judged failed: %s; starting recovery", version, verdict.reason)
        self.notifier.status(f"candidate {version} judged failed: {verdict.reason}; starting "
                             "recovery")
        self.workload.stop()
        controller.fire(Trigger.judge_failed, reason=verdict.reason,
                        reason_class=verdict.reason_class)
        return False

    def _signal(self) -> UpgradeSignal | str:
        """The pending upgrade's signal, or why there is none to judge by: gone, unreadable."""
        try:
            sig = self.node.signal()
        except SignalError as exc:
            return f"its upgrade signal cannot be read ({exc})"
        return sig if sig is not None else \
            f"its upgrade signal {self.node.paths.signal_file} is gone"

    def not_judged(self, doc: StateDoc, version: str, why: str) -> bool:
        """A candidate whose signal is lost is not judged: its starts cannot be counted nor a
        verdict recorded. Start the recovery unit and exit 1; the last-good's start check refuses
        the next start too."""
        unit = self.node.paths.recovery_unit_name
        log.error("candidate %s is not judged: %s, while the state file (%s) knows its upgrade; "
                  "starting %s to roll back to the last-good", version, why, doc.state, unit)
        self.notifier.status(f"candidate {version} not judged: its upgrade signal is lost; "
                             f"starting {unit}")
        try:
            self.node.effectors.systemd.start(unit)
        except AgentFsmError as exc:
            log.warning("could not start %s (%s): the last-good's start check starts it at the "
                        "next start", unit, exc)
        return False

    def _stopped(self, verdict: judge_mod.Verdict) -> bool:
        """Whether a failed judgment is a stop's doing: SIGTERM came, or the workload died of it
        first (systemd signals the whole unit)."""
        if verdict.reason_class == ReasonClass.stopped or self.waker.stop:
            return True
        died_of_term = (w := self.workload.process) is not None and w.poll() == -signal.SIGTERM
        return died_of_term and self._stop_follows()

    def publish_and_open_gate(self) -> StateDoc:
        """`open_gate_after_judgment` with this node's bound on a dead publisher."""
        return open_gate_after_judgment(
            self.node.controller, self.clock, before_try=self.extend_start,
            give_up_after=self.node.config.publish_give_up_seconds,
            stopping=lambda: self.waker.stop, each_try=self.node.releases.checked_once)

    def publish_then_open_gate(self, _doc: StateDoc, selected: str) -> bool:
        self.status("publishing the result of the upgrade before opening the gate")
        self.publish_and_open_gate()
        if not self.waker.stop:
            self.workload.start(selected)
        return True

    def start_recovery_unit(self, doc: StateDoc, selected: str) -> bool:
        log.error("the upgrade to %s failed and %s is still selected; starting recovery",
                  doc.upgrade.to_version if doc.upgrade else "?", selected)
        self.node.effectors.systemd.start(self.node.paths.recovery_unit_name)
        return False

    def finish_recovery(self, doc: StateDoc, selected: str) -> bool:
        if selected != self.node.releases.last_good():
            return self.start_recovery_unit(doc, selected)
        with self.node.releases.checked_once():  # this check serves the start's others
            try:
                with self.node.store.locked():  # a file put back from an intact copy, if need be
                    way_back_release(self.node.effectors, None, selected, fall_back=False)
            except ReleaseError as exc:
                # Damaged beyond repair: `recover` falls back to the newest intact known-good
                # release (`select_last_good`) and restarts the agent unit.
                log.error("last-good %s cannot be run: %s; starting recovery, which falls back "
                          "to the newest intact known-good release", selected, exc)
                self.notifier.status(f"last-good {selected} is damaged; starting recovery")
                self.node.effectors.systemd.start(self.node.paths.recovery_unit_name)
                return False
            self.status(f"back on last-good {selected}: clearing the signal, writing assets")
            return self._fire_and_serve(Trigger.recovered, selected)

    def converge_then_open_gate(self, _doc: StateDoc, selected: str) -> bool:
        self.status("converging the service assets")
        restarts = self.workload.ask_restarts()
        return self._fire_and_serve(Trigger.settle, selected,
                                    **({"restarts": restarts} if restarts else {}))

    def _fire_and_serve(self, trigger: Trigger, selected: str, **args: object) -> bool:
        # The transition renders the release's assets and the workload starts from it right after:
        # one digest check serves both.
        with self.node.releases.checked_once():
            self.node.controller.fire(trigger, **args)
            self.workload.start(selected)
        return True

    def _stop_follows(self, grace: float = 5.0) -> bool:
        """The workload got SIGTERM: is the unit being stopped (our SIGTERM on its way)?"""
        end = time.monotonic() + grace
        while not self.waker.stop and (left := end - time.monotonic()) > 0:
            self.waker.wait(left)
        return self.waker.stop

    def run(self) -> int:
        try:
            if not self.startup():
                return 1
        except AgentFsmError as exc:
            log.error("%s", exc)
            self.notifier.status(f"failed: {exc}")
            self.workload.stop()
            return 1
        if self.waker.stop:
            self.notifier.stopping()
            self.workload.stop()
            return 0
        version = self.node.releases.selected()
        self.notifier.ready(self.workload.serving_status(version))
        log.info("ready: %s running, gate open", version)
        follow_timer.keep_logged(self.node.effectors)  # the gate is open: written or removed
        return_free_memory()
        interval = watchdog_interval()
        retry = self.deliver_results()
        next_try = None if retry is None else time.monotonic() + retry
        forget_at = time.monotonic() + self.workload.stable_after if self.workload.restarts else None
        looks = Looks(self.dead_command, OWED_CHECK_SECONDS)
        try:
            return self._serve(version, interval, next_try, forget_at, looks)
        finally:
            looks.close()

    def _serve(self, version: str | None, interval: float | None, next_try: float | None,
               forget_at: float | None, looks: Looks) -> int:
        """Serve until a stop or the workload's end; wake only for what is due."""
        while not self.waker.stop:
            if interval is not None:
                self.notifier.watchdog()
            waits = [w for w in (interval, next_try and max(next_try - time.monotonic(), 0),
                                 forget_at and max(forget_at - time.monotonic(), 0),
                                 looks.due_in()) if w is not None]
            self.waker.wait(min(waits) if waits else None, looks.fd)
            if not self.waker.stop:
                looks.after_wake()
            if forget_at is not None and time.monotonic() >= forget_at and not self.waker.stop:
                self.workload.forget_crashes()
                forget_at = None
            if next_try is not None and time.monotonic() >= next_try and not self.waker.stop:
                retry = self.deliver_results()
                next_try = None if retry is None else time.monotonic() + retry
            if self.waker.stop:
                # On a stop systemd signals the whole cgroup, so the workload may exit first: that
                # is the stop, not a failure (which would start recovery).
                break
            if (w := self.workload.process) is not None and w.poll() is not None:
                code = w.returncode
                if code == -signal.SIGTERM and self._stop_follows():
                    break
                return self.workload.died(version, code)
        log.info("stopping on request")
        self.notifier.stopping()
        self.workload.stop()
        return 0


# What a daemon start does from each state, by its `on_start` in states/agent-upgrade.toml.
ON_START: Mapping[OnStart, Callable[[Daemon, StateDoc, str], bool]] = handlers(OnStart, {
    OnStart.refuse_not_installed: Daemon.refuse_not_installed,
    OnStart.judge_candidate: Daemon.judge_candidate,
    OnStart.publish_then_open_gate: Daemon.publish_then_open_gate,
    OnStart.start_recovery_unit: Daemon.start_recovery_unit,
    OnStart.finish_recovery: Daemon.finish_recovery,
    OnStart.converge_then_open_gate: Daemon.converge_then_open_gate,
}, "the daemon")


def main(node: Node) -> int:
    setup_logging()
    waker = Waker()
    node.store.stopping = lambda: waker.stop  # a wait for the writers' lock hears a stop
    daemon = Daemon(node, Notifier(), waker)
    try:
        return daemon.run()
    except StopRequested as stop:  # no transition left half-done (owed effects resume): exit 0
        log.info("stopping on request: %s", stop)
        daemon.notifier.stopping()
        daemon.workload.stop()
        return 0
