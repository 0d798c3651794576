"""The daemon the agent unit runs: resume, judge or converge, open the gate, then READY=1.

At start it finishes whatever a crash left owed, rolls back a signal the state file does not
know (from the sources of `orphaned_signal`), then does what the state's `on_start` in
states/agent-upgrade.toml says, by ON_START (the names in words: `definition.MEANINGS`, shown in
diagrams/agent-upgrade.md). Judging a candidate: hold the last-good's assets (write only missing
ones), count the attempt, judge it; judged ok -> publish, clear the signal, write its assets,
reload, promote, open the gate; judged failed -> record the result, keep the signal, start the
recovery unit, exit 1. A candidate whose signal is gone or cannot be read, at its start or
when its verdict comes, is not judged: it starts the recovery unit and exits 1. A stop
(SIGTERM: `systemctl stop`, a reboot) during the judgment is no verdict: the signal stays,
nothing is recorded, the process exits 0, and the next start judges again with one more
attempt counted, as after a power cut.

Only the last-good's code runs the way back: the engine refuses (NotItsRole) a transition that is
not this process's role to fire or finish (`by` in states/; the role from the release this
process was started from, `upgrade.roles`), touching nothing. The daemon then hands over: when
another release is selected, it restarts its own unit (so that the selected release's start does
it) and waits for the stop; else it starts the recovery unit (the last-good's way back) and exits
1.

Only then READY=1, so systemd's TimeoutStartSec bounds the judgment. It then supervises the
release's workload (if any), pings the watchdog when systemd asks for it, and on SIGTERM says
STOPPING=1 and exits 0. Every OWED_CHECK_SECONDS it looks (a stat of the state file) for what a
command that died left (`DeadCommand`): what the last-good's own start would do (abandon an
upgrade cut before it selected its candidate, roll back a signal the state file knows nothing
of) it does in place, the workload running; for the rest it restarts its own unit, whose start
finishes it. Signal handlers only set flags; waits are on a wake-up pipe, so an idle daemon
wakes only for that look.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from ..errors import AgentFsmError, NotItsRole, ReleaseError, SignalError, StopRequested
from ..machine.definition import OnStart, Role, handlers
from ..machine.vocabulary import StateName, Trigger
from ..node.assets.render import RELEASES_VIEW
from ..node.releases import workload as workload_command
from ..node.runtime import workload as workload_state
from ..node.runtime.signal import UpgradeSignal
from ..node.state.store import CRASH_LOOP_WINDOW, OWED_CHECK_SECONDS, StateDoc
from ..system import workload as workload_proc
from ..system.notify import Notifier, watchdog_interval
from ..upgrade import way_back
from ..upgrade.releases import way_back as way_back_release
from ..wiring import Node
from . import judge as judge_mod
from .publishing import PUBLISH_RETRY_FIRST, PUBLISH_RETRY_MAX, open_gate_after_judgment
from .runtime import Waker, WakerClock, return_free_memory, setup_logging

log = logging.getLogger("agent_fsm")

DELIVERY_RETRY_MAX = 300.0
STOP_GRACE = 30.0  # how long to wait for the stop of a restart this process queued


class DeadCommand:
    """Finds work a command that is gone left on the node while this daemon serves, the
    writers' lock free at once: no process is doing it. Its writer held the lock from the
    write-ahead to the final record, so a live command, however slow, holds it and is left
    alone (the lock is tried before anything is acted on). Two kinds (`in_place` tells them
    apart):

    - `restart`: an operator's transition (`install`, `activate`, `upgrade`'s `begin_upgrade`
      once it selected its candidate) left owed by a command that died (SIGKILL, an OOM, a lost
      ssh session) or failed at an effect (exit 1): another release's start must finish it.
      Never a transition of another role (the candidate's, the way back's), nor an
      `install --no-start` (its operator asked for no restart).
    - `in_place`: what the last-good's own start would do and this process, the last-good's
      code serving as the selected release, can do without a restart: abandon an upgrade cut
      before it selected its candidate; roll back a signal the state file knows nothing of
      (restored from a backup, or lost); then finish that (`recovered`, `settle`), also when
      an earlier try here failed half-way (its transition owed, or `recovering` not finished,
      or the gate still shut after `abandon_upgrade`).

    `look` costs a stat of the state file while nothing is found; the file is read when it
    changed (or something was found at the last look), and the lock tried only then."""

    def __init__(self, node: Node, release: str | None = None) -> None:
        self.node = node
        self.release = release  # the release this process runs; None: the selected (tests)
        self._mark: tuple[int, int, int] | None = None
        self._owed = False  # the last read found work

    def _operators(self, doc: StateDoc) -> bool:
        pending = doc.pending
        if pending is None or self.node.controller.unknown(pending):
            return False  # nothing owed, or a later agent-fsm's: whose it is is not known here
        return self.node.definition.finished_for_a_dead_command(pending.trigger, pending.args)

    def in_place(self, doc: StateDoc) -> bool:
        """Whether `doc` holds work this process, the last-good's code, finishes in place."""
        node, releases = self.node, self.node.releases
        last_good = releases.last_good()
        mine = self.release if self.release is not None else releases.selected()
        if last_good is None or mine != last_good:
            return False  # not the last-good's code: another release's start does it
        pending = doc.pending
        if pending is not None:
            if node.controller.unknown(pending):
                return False
            if pending.trigger == Trigger.begin_upgrade:  # cut before it selected its candidate
                return releases.selected() == mine \
                    and node.controller.supersedes(Trigger.abandon_upgrade, doc)
            # An earlier try here that failed half-way (a start would have exited instead).
            return pending.trigger in (Trigger.settle, Trigger.recovered) or (
                pending.trigger in (Trigger.abandon_upgrade, Trigger.orphaned_signal)
                and bool(pending.args.get("no_start")))
        if way_back.orphan(node, doc) is not None:
            return True  # a signal the state file knows nothing of
        if releases.selected() != mine:
            return False
        if doc.state == StateName.recovering:
            return True  # rolled back in place, `recovered` not yet fired
        if doc.state != StateName.converged or node.gate.is_open() or node.signal() is not None:
            return False  # serving as it should (the journal is read only past this)
        history = node.store.history(doc)
        return bool(history) and history[-1].get("trigger") == Trigger.abandon_upgrade

    def _found(self, doc: StateDoc) -> bool:
        return self._operators(doc) or self.in_place(doc)

    def look(self) -> StateDoc | None:
        """The state file, read holding the writers' lock, when it holds work a command that
        is gone left (`in_place` says which kind), else None. Never waits: the lock is tried
        once, and held only to read the state file again."""
        store = self.node.store
        try:
            st = os.stat(store.path)
            mark = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:  # lost, or not installed: the initial state
            mark = (0, 0, 0)
        if mark == self._mark and not self._owed:
            return None
        self._mark = mark
        self._owed = self._found(store.read())
        if not self._owed:
            return None
        with store.locked_if_free() as free:
            if not free:  # its command (or another writer) holds the lock: it is alive
                return None
            doc = store.read()
            self._owed = self._found(doc)
            return doc if self._owed else None

    def again(self) -> None:
        """Read the state file at the next look even if it did not change (a try failed)."""
        self._owed = True


class Daemon:
    def __init__(self, node: Node, notifier: Notifier, waker: Waker) -> None:
        self.node = node
        self.notifier = notifier
        self.waker = waker
        self.clock = WakerClock(waker)
        self.workload: subprocess.Popen[bytes] | None = None
        self.workload_record: workload_state.Record | None = None  # <run_dir>/workload.json
        self.last_exit: workload_state.Exit | None = None
        self._restarts_asked = False
        self.retry_delay = PUBLISH_RETRY_FIRST / 2
        self.restarts = 0  # systemd's automatic restarts before this start (after crashes)
        # Up this long after a start that followed crashes, the crash loop is over.
        self.stable_after = CRASH_LOOP_WINDOW
        process = node.controller.process
        # The release this process runs (fixed at its start); None: not checked (tests).
        self.release = None if process is None else process.release
        self.dead_command = DeadCommand(node, self.release)
        self._owed_restart_at: float | None = None  # when it asked for its unit's restart

    # Workload ---------------------------------------------------------------------------
    def _release_env(self, version: str) -> dict[str, str]:
        """What the checks are given of the release (the store's paths: they run as root)."""
        release_dir = self.node.releases.path(version)
        return {"AGENT_FSM_VERSION": version, "AGENT_FSM_RELEASE_DIR": str(release_dir),
                "AGENT_FSM_PAYLOAD_DIR": str(release_dir / "payload")}

    def start_workload(self, version: str) -> None:
        """Start the release's workload (if it declares one) as `[workload]` says: its user,
        its directory, its environment, its own journal identifier; record it in
        `<run_dir>/workload.json`. WorkloadError (or ReleaseError) if it cannot start."""
        argv = self.node.releases.manifest(version).workload
        if not argv:
            return
        node, settings = self.node, self.node.config.workload
        who = workload_proc.account(settings.user, settings.group,
                                    f"config {node.config.source or '(defaults)'}")
        release_dir = node.releases.path(version)
        payload = release_dir / "payload"
        cwd = payload if payload.is_dir() else release_dir
        view = node.paths.real(node.config.run_dir) / RELEASES_VIEW / version
        if who.change and (view / "release.toml").is_file():
            # Another user cannot pass the 0700 state dir: it sees the releases below the run
            # dir (the unit's BindReadOnlyPaths=), the same files read-only.
            release_dir, payload, cwd = view, view / "payload", view / cwd.relative_to(release_dir)
        elif who.change:
            log.warning("the agent unit running now binds no view of the releases at %s (its "
                        "assets were written by an agent-fsm before it): %s cannot reach %s",
                        view.parent, who.words(), release_dir)
        command = workload_command.expand(argv, release_dir=str(release_dir),
                                          payload_dir=str(payload), version=version)
        env = workload_proc.environment(who, {
            "AGENT_FSM_VERSION": version, "AGENT_FSM_RELEASE_DIR": str(release_dir),
            "AGENT_FSM_PAYLOAD_DIR": str(payload)}, settings.environment)
        identifier = settings.identifier or node.paths.name
        stream = workload_proc.journal_stream(identifier)
        if stream is None:
            log.info("journald's stream socket %s is not there: the workload's output goes "
                     "where agent-fsm's does", workload_proc.JOURNAL_STDOUT)
        log.info("starting workload of %s as %s in %s (journal identifier %s): %s", version,
                 who.words(), cwd, identifier if stream else "agent-fsm's", " ".join(command))
        if not self._restarts_asked:
            self.restarts, self._restarts_asked = self.automatic_restarts(), True
        try:
            self.workload = workload_proc.start(
                command, cwd=cwd, env=env, who=who, output=stream,
                read_only=self.kept_from_workload(), unconfined=log.warning)
        finally:
            if stream is not None:
                stream.close()  # the workload holds its own copy
        self.workload_record = workload_state.Record(
            version, command, who.name, True, self.workload.pid,
            workload_state.iso(time.time()), self.restarts, self.last_exit, os.getpid())
        self._record_workload()

    def kept_from_workload(self) -> tuple[Path, ...]:
        """What the workload sees read-only whatever its user: agent-fsm's directories (the
        state dir with the store, the recovery script's, the units', the gate's), below
        `--root` where they really are. A `writable_paths` entry inside one stays read-only."""
        paths, config = self.node.paths, self.node.config
        return tuple(paths.real(d) for d in (config.state_dir, config.lib_dir, config.unit_dir,
                                             config.run_dir))

    def _record_workload(self) -> None:
        if self.workload_record is None:
            return
        try:
            workload_state.write(self.node.paths, self.workload_record)
        except AgentFsmError as exc:  # status then shows what it can check: not running
            log.warning("could not record the workload in %s: %s",
                        self.node.paths.workload_file, exc)

    def _workload_exited(self) -> workload_state.Exit | None:
        """The workload's exit, recorded once it is seen; None while it runs (or if none)."""
        if self.workload is None or self.workload.poll() is None:
            return None
        if self.workload_record is not None and self.workload_record.running:
            self.last_exit = workload_state.Exit.of(self.workload.returncode, time.time())
            self.workload_record = self.workload_record._replace(
                running=False, last_exit=self.last_exit)
            self._record_workload()
        return self.last_exit

    def workload_alive(self) -> bool:
        return self.workload is None or self._workload_exited() is None

    def stop_workload(self) -> None:
        if self.workload is None or self.workload.poll() is not None:
            self._workload_exited()
            return
        self.workload.terminate()
        try:
            self.workload.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.workload.kill()
            self.workload.wait()
        self._workload_exited()

    # Startup ----------------------------------------------------------------------------
    def status(self, text: str) -> None:
        log.info("%s", text)
        self.notifier.status(text)

    def extend_start(self, tries: int, why: str) -> None:
        """Before each try to publish a judged-ok result: give systemd's start timeout room
        for one more try (the publish command's own timeout plus a margin)."""
        room = float(getattr(self.node.effectors.publisher, "timeout", 30.0)) + PUBLISH_RETRY_MAX + 10
        text = ("publishing the result before opening the gate" if tries == 1 else
                f"publishing the result failed, try {tries}: {why}")
        self.notifier.extend_timeout(room, text)

    def deliver_results(self) -> float | None:
        """Deliver recorded results still queued (a rolled-back one, say); None when the outbox
        is empty, else the seconds until the next try. Never blocks the way back."""
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
        """The state is another role's to change: leave it as it is and hand over. With another
        release selected, its own start does it: restart this unit and wait for the stop (exit
        0: no failure, so no `OnFailure=` on systemd >= 255; exit 1 if no stop comes, and
        `Restart=` starts the selected). With this one selected, the way back is owed to the
        last-good's code: start the recovery unit and exit 1."""
        self.stop_workload()
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
        # An upgrade cut before its candidate started: the last-good abandons it (never
        # finishes it: the way back, queued by the failure that cut it, would then roll back
        # and mark a version that never ran); this start is the last-good's, so no restart,
        # and it opens the gate below.
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
        env = self._release_env(version)
        verdict = judge_mod.Verdict(False, "not judged")
        try:
            self.start_workload(version)
            verdict = judge_mod.judge(
                judgment, attempt=sig.attempt, clock=self.clock,
                check=lambda spec, timeout: judge_mod.run_check(spec, env, timeout),
                alive=self.workload_alive, stopping=lambda: self.waker.stop,
            )
        except AgentFsmError as exc:
            verdict = judge_mod.Verdict(False, str(exc), "crashed")
        if not verdict.ok and self._stopped(verdict):
            # No verdict: keep the signal, record nothing, mark nothing; the next start judges
            # again (an attempt counted), exactly as after a power cut.
            log.warning("stopped while judging candidate %s (%s): no verdict; the signal stays "
                        "and the next start judges it again", version, verdict.reason)
            self.stop_workload()
            return True
        if verdict.ok and isinstance(lost := self._signal(), str):
            self.stop_workload()
            return self.not_judged(doc, version, lost)
        if verdict.ok:
            self.status(f"candidate {version} judged ok: {verdict.reason}")
            controller.fire(Trigger.judge_ok)
            self.publish_and_open_gate()
            return True
        log.error("candidate %s judged failed: %s; starting recovery", version, verdict.reason)
        self.notifier.status(f"candidate {version} judged failed: {verdict.reason}; starting "
                             "recovery")
        self.stop_workload()
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
        """A candidate whose signal is lost is not judged: its starts cannot be counted, nor a
        verdict recorded where the start check and `recover` read it. Start the recovery unit
        (the last-good's way back; this process fires nothing of it) and exit 1; the
        last-good's start check refuses the next start and starts it too."""
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
        """Whether a failed judgment is the doing of a stop: SIGTERM came, or the workload died
        of it (systemd signals the whole unit, so it may die before this process hears)."""
        if verdict.reason_class == "stopped" or self.waker.stop:
            return True
        died_of_term = self.workload is not None and self.workload.poll() == -signal.SIGTERM
        return died_of_term and self._stop_follows()

    def publish_and_open_gate(self) -> StateDoc:
        """`open_gate_after_judgment` with this node's bound on a dead publisher."""
        return open_gate_after_judgment(
            self.node.controller, self.clock, before_try=self.extend_start,
            give_up_after=self.node.config.publish_give_up_seconds,
            stopping=lambda: self.waker.stop)

    def publish_then_open_gate(self, _doc: StateDoc, selected: str) -> bool:
        self.status("publishing the result of the upgrade before opening the gate")
        self.publish_and_open_gate()
        if not self.waker.stop:
            self.start_workload(selected)
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
                # Damaged beyond repair: the recovery unit's `recover` falls back to the newest
                # intact known-good release (`select_last_good`) and restarts the agent unit.
                log.error("last-good %s cannot be run: %s; starting recovery, which falls back "
                          "to the newest intact known-good release", selected, exc)
                self.notifier.status(f"last-good {selected} is damaged; starting recovery")
                self.node.effectors.systemd.start(self.node.paths.recovery_unit_name)
                return False
            self.status(f"back on last-good {selected}: clearing the signal, writing assets")
            return self._fire_and_serve(Trigger.recovered, selected)

    def converge_then_open_gate(self, _doc: StateDoc, selected: str) -> bool:
        self.status("converging the service assets")
        restarts = self.restarts = self.automatic_restarts()
        self._restarts_asked = True
        return self._fire_and_serve(Trigger.settle, selected,
                                    **({"restarts": restarts} if restarts else {}))

    def automatic_restarts(self) -> int:
        """How many times systemd restarted the agent unit after a failure since it was last
        started by hand (`NRestarts`; 0 when systemd cannot say): above 0, this start follows
        a crash, and the history counts it in the crash loop's one entry."""
        unit = self.node.paths.agent_unit_name
        try:
            shown = self.node.effectors.systemd.show(unit, ("NRestarts",))
        except AgentFsmError as exc:
            log.info("could not ask systemd how often %s was restarted: %s", unit, exc)
            return 0
        value = shown.get("NRestarts", "")
        return int(value) if value.isdigit() else 0

    def forget_crashes(self) -> None:
        """Up `stable_after` seconds after a start that followed crashes: the crash loop is
        over, so reset systemd's count of the unit's automatic restarts (`reset-failed`): the
        next crash waits `RestartSec=` again, not the longest delay the loop had reached
        (`RestartSteps=`, systemd 254+). The explicit reset is the intent here, and nothing
        else depends on it (the unit has no start limit); a refused one is only logged."""
        unit = self.node.paths.agent_unit_name
        try:
            self.node.effectors.systemd.reset_failed(unit)
        except AgentFsmError as exc:
            log.warning("up %.0fs after %d restart(s), could not reset %s's restart count: %s",
                        self.stable_after, self.restarts, unit, exc)
            return
        log.info("up %.0fs after %d restart(s): the crash loop is over; %s's restart count "
                 "reset", self.stable_after, self.restarts, unit)

    def _fire_and_serve(self, trigger: Trigger, selected: str, **args: object) -> bool:
        # The transition renders the release's assets and the workload starts from it right
        # after: one check of the release against its digest serves both.
        with self.node.releases.checked_once():
            self.node.controller.fire(trigger, **args)
            self.start_workload(selected)
        return True

    # Serving ----------------------------------------------------------------------------
    def finish_dead_command(self) -> bool:
        """A command died and left work on the node (`DeadCommand`). What the last-good's
        start would do without another release, this process does in place, the workload
        running throughout (`finish_in_place`). Else an operator's transition is owed that
        another release's start must finish (`install`, `activate`, an upgrade that selected
        its candidate): restart this unit, so that the selected release's start finishes it and
        judges that. The gate is shut already (the command's first effect). True when the work
        was done or the restart asked; a failure is logged and tried again at the next look."""
        now = time.monotonic()
        if self._owed_restart_at is not None and now - self._owed_restart_at < STOP_GRACE:
            return False  # asked already: its stop is on the way
        try:
            doc = self.dead_command.look()
        except AgentFsmError as exc:  # a damaged state file, a lock that cannot be opened
            log.warning("could not look for an operator's command left owed: %s", exc)
            return False
        if doc is None:
            return False
        if self.dead_command.in_place(doc):
            return self.finish_in_place(doc)
        owed = doc.pending
        if owed is None:  # what `in_place` found at the look is gone since: look again
            self.dead_command.again()
            return False
        unit = self.node.paths.agent_unit_name
        left = ", ".join(owed.effects[owed.done:])
        log.warning("an operator's %s was left owed at effect %d of %d (%s not run) and no "
                    "process holds the writers' lock: the command that ran it is gone; "
                    "restarting %s so that its start finishes it", owed.trigger, owed.done + 1,
                    len(owed.effects), left, unit)
        self.notifier.status(f"an operator's {owed.trigger} died half-way; restarting {unit} "
                             "to finish it")
        try:
            self.node.effectors.systemd.restart(unit)
        except AgentFsmError as exc:
            log.error("%s; trying again in %.0fs", exc, OWED_CHECK_SECONDS)
            return False
        self._owed_restart_at = now
        return True

    def finish_in_place(self, doc: StateDoc) -> bool:
        """Do here what the last-good's start would do, without stopping the workload: abandon
        an upgrade cut before it selected its candidate (`abandon_upgrade`, nothing marked known
        bad), or roll back a signal the state file knows nothing of (`orphaned_signal`, its
        restart not asked), then finish as a start from there does (`recovered`, `settle`:
        the assets converged, the gate opened). True when the gate is open again. A failure
        (a full disk, a held lock) leaves the rest owed: logged in one line, and the next look
        tries again; this process never exits for it, so the workload keeps running."""
        node = self.node
        owed = doc.pending
        what = (f"an operator's {owed.trigger} left owed by a command that is gone"
                if owed is not None and owed.trigger == Trigger.begin_upgrade else
                "an upgrade signal the state file knows nothing of" if owed is None
                and way_back.orphan(node, doc) is not None else
                "an earlier try here, left half-way")
        try:
            doc = way_back.clear_leftovers(node, doc, way_back.IN_PLACE).doc
            on_start = node.definition.state(doc.state).on_start
            if on_start == OnStart.finish_recovery:
                doc = node.controller.fire(Trigger.recovered)
            elif on_start == OnStart.converge_then_open_gate and not node.gate.is_open():
                doc = node.controller.fire(Trigger.settle)
        except AgentFsmError as exc:
            log.error("could not finish %s here (the workload left running): %s; trying "
                      "again in %.0fs", what, exc, OWED_CHECK_SECONDS)
            self.dead_command.again()
            # As a start that failed leaves it (its RuntimeDirectory= gone): shut until done,
            # also when it failed after its `open_gate` (`settle` still owed).
            with contextlib.suppress(AgentFsmError):
                node.gate.close()
            return False
        version = node.releases.selected()
        log.info("finished %s in place: %s running, gate %s", what, version,
                 "open" if node.gate.is_open() else "shut")
        self.notifier.status(self.serving_status(version))
        return node.gate.is_open()

    def serving_status(self, version: str | None) -> str:
        """The unit's STATUS= once the gate is open: whether the workload runs, never more."""
        head = f"{self.node.paths.name} {version}: gate open"
        if self.workload is None:
            return f"{head}; no workload"
        exit_ = self._workload_exited()
        if exit_ is not None:
            return f"{head}; workload {exit_.words()}"
        return f"{head}; workload running (pid {self.workload.pid})"

    def workload_died(self, version: str | None, code: int) -> int:
        """After convergence the workload is the agent: when it exits, the daemon exits with
        its status (1 for a signal) and systemd restarts the unit (`Restart=on-failure`, with
        growing delays where systemd has them), which starts the workload again; never rolled
        back. STATUS= says so first, so `systemctl status` never shows it running meanwhile."""
        exit_ = self._workload_exited() or workload_state.Exit.of(code, time.time())
        log.error("workload of %s %s; exiting so that systemd restarts %s", version,
                  exit_.words(), self.node.paths.agent_unit_name)
        self.notifier.status(f"{self.node.paths.name} {version}: workload {exit_.words()}; "
                             "restarting the unit")
        return code if code > 0 else 1

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
            self.stop_workload()
            return 1
        if self.waker.stop:
            self.notifier.stopping()
            self.stop_workload()
            return 0
        version = self.node.releases.selected()
        self.notifier.ready(self.serving_status(version))
        log.info("ready: %s running, gate open", version)
        return_free_memory()
        interval = watchdog_interval()
        retry = self.deliver_results()
        next_try = None if retry is None else time.monotonic() + retry
        forget_at = time.monotonic() + self.stable_after if self.restarts else None
        look_at = time.monotonic() + OWED_CHECK_SECONDS
        while not self.waker.stop:
            if interval is not None:
                self.notifier.watchdog()
            waits = [w for w in (interval, next_try and max(next_try - time.monotonic(), 0),
                                 forget_at and max(forget_at - time.monotonic(), 0),
                                 max(look_at - time.monotonic(), 0))
                     if w is not None]
            self.waker.wait(min(waits))
            if time.monotonic() >= look_at and not self.waker.stop:
                self.finish_dead_command()
                look_at = time.monotonic() + OWED_CHECK_SECONDS
            if forget_at is not None and time.monotonic() >= forget_at and not self.waker.stop:
                self.forget_crashes()
                forget_at = None
            if next_try is not None and time.monotonic() >= next_try and not self.waker.stop:
                retry = self.deliver_results()
                next_try = None if retry is None else time.monotonic() + retry
            if self.waker.stop:
                # On a stop systemd signals the whole cgroup, so the workload may exit first:
                # that is the stop, not a failure (a failure would start recovery).
                break
            if self.workload is not None and self.workload.poll() is not None:
                code = self.workload.returncode
                if code == -signal.SIGTERM and self._stop_follows():
                    break
                return self.workload_died(version, code)
        log.info("stopping on request")
        self.notifier.stopping()
        self.stop_workload()
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
        daemon.stop_workload()
        return 0
