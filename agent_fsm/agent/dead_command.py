"""An operator's command that died and left work on the node, found and finished while the
daemon serves (`DeadCommand`).

The daemon looks when the state dir changes, and by the clock while `needs_timer` says so. What
the last-good's own start would do, it does in place with the workload running; for the rest it
restarts its unit, whose start finishes the work.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time

from ..errors import AgentFsmError
from ..machine.definition import OnStart
from ..machine.vocabulary import StateName, Trigger
from ..node.state.store import OWED_CHECK_SECONDS, StateDoc
from ..system.inotify import DirWatch
from ..system.notify import Notifier
from ..upgrade import way_back
from ..wiring import Node
from .supervision import Workload

log = logging.getLogger("agent_fsm")

STOP_GRACE = 30.0  # how long to wait for the stop of a restart this process queued


class DeadCommand:
    """Finds work a gone command left: owed work whose writers' lock is free at once.

    A live command holds the lock from write-ahead to final record, so it is left alone. Two
    kinds (`in_place`):

    - `restart`: an operator's transition left by a command that died or failed at an effect;
      another release's start finishes it. Never another role's, nor `install --no-start`.
    - `in_place`: abandon an upgrade cut before it selected its candidate, or roll back an orphaned
      signal, then finish (`recovered`, `settle`).

    While nothing is found, `look` costs one stat.
    """

    def __init__(self, node: Node, release: str | None, notifier: Notifier,
                 workload: Workload) -> None:
        self.node = node
        self.release = release  # the release this process runs; None: the selected (tests)
        self.notifier = notifier
        self.workload = workload
        self._mark: tuple[int, int, int] | None = None
        self._owed = False  # the last read found work
        self.restart_asked_at: float | None = None  # when it asked for its unit's restart

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
        """The state file, re-read under the writers' lock, when it holds a gone command's work; else None."""
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

    def watch(self) -> DirWatch | None:
        """A watch on the state dir; None where inotify is missing (`needs_timer` is then always true)."""
        return DirWatch.open(self.node.paths.state_dir)

    def needs_timer(self) -> bool:
        """Whether the next look must come by the clock: found work is held, a try failed, or a
        restart was asked. Lock tries write the state dir themselves, so no change can be waited
        for."""
        return self._owed or self.restart_asked_at is not None

    def again(self) -> None:
        """Read the state file at the next look even if it did not change (a try failed)."""
        self._owed = True

    def finish(self) -> bool:
        """Finish a gone command's work: in place if the last-good's start would, else by a restart.

        The gate is already shut. True when done or the restart asked; a failure is logged and
        retried.
        """
        now = time.monotonic()
        if self.restart_asked_at is not None and now - self.restart_asked_at < STOP_GRACE:
            return False  # asked already: its stop is on the way
        try:
            doc = self.look()
        except AgentFsmError as exc:  # a damaged state file, a lock that cannot be opened
            log.warning("could not look for an operator's command left owed: %s", exc)
            return False
        if doc is None:
            return False
        if self.in_place(doc):
            return self.finish_in_place(doc)
        owed = doc.pending
        if owed is None:  # what `in_place` found at the look is gone since: look again
            self.again()
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
        self.restart_asked_at = now
        return True

    def finish_in_place(self, doc: StateDoc) -> bool:
        """Do what the last-good's start would do, without stopping the workload; True once the gate opens.

        Abandon a cut upgrade or roll back an orphan, then `recovered` and `settle`. A failure
        leaves the rest owed for the next look; the process never exits for it.
        """
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
            self.again()
            # As a start that failed leaves it (its RuntimeDirectory= gone): shut until done,
            # also when it failed after its `open_gate` (`settle` still owed).
            with contextlib.suppress(AgentFsmError):
                node.gate.close()
            return False
        version = node.releases.selected()
        log.info("finished %s in place: %s running, gate %s", what, version,
                 "open" if node.gate.is_open() else "shut")
        self.notifier.status(self.workload.serving_status(version))
        return node.gate.is_open()


class Looks:
    """When the serving daemon looks: `every` seconds after ready, then on changes or by the clock."""

    def __init__(self, dead: DeadCommand, every: float) -> None:
        self.dead = dead
        self.every = every
        self.watch = dead.watch()
        self.at: float | None = time.monotonic() + every

    @property
    def fd(self) -> int | None:
        return None if self.watch is None else self.watch.fd

    def due_in(self) -> float | None:
        """Seconds until the next look by the clock; None: only a change brings it."""
        return None if self.at is None else max(self.at - time.monotonic(), 0)

    def after_wake(self) -> None:
        """Look if a change came or the clock says so; then say when the next one is due."""
        changed = self.watch is not None and self.watch.changed()
        if self.watch is not None and self.watch.gone:  # the state dir itself went
            self.close()
        if (self.at is not None and time.monotonic() >= self.at) or (changed and self.at is None):
            self.dead.finish()
            self.at = None
        if self.at is None and (self.watch is None or self.dead.needs_timer()):
            self.at = time.monotonic() + self.every

    def close(self) -> None:
        if self.watch is not None:
            self.watch.close()
            self.watch = None
