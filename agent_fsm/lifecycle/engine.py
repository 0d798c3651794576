"""The lifecycle machine: the declared definition, run by `transitions`, made crash-safe.

`Controller.fire(trigger)` takes the writers' lock, resumes any transition a crash left owed,
checks that the trigger is allowed from the current state and that its conditions hold, records
the transition and the effects it owes in the state file (write-ahead), runs the effects one by
one recording progress after each, and finally records the new state and a history entry. A
crash anywhere leaves a state file from which `resume` reaches the same end state.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import AgentFsmError, IllegalTransition
from ..node.store import Pending, StateDoc, Store
from . import counters
from . import definition as definition_mod
from .definition import Definition
from .effects import CONDITIONS, EFFECTS, Host, Step

if TYPE_CHECKING:
    from transitions import EventData, Machine

log = logging.getLogger("agent_fsm")


FAILPOINT_ENV = "AGENT_FSM_FAILPOINT"


def env_failpoint(trigger: str, index: int) -> None:
    """Kill this process with SIGKILL at `$AGENT_FSM_FAILPOINT` ("trigger:index"), for tests."""
    if os.environ.get(FAILPOINT_ENV) == f"{trigger}:{index}":
        os.kill(os.getpid(), signal.SIGKILL)


def load_definition(text: str | None = None, source: str = "<text>") -> Definition:
    """The shipped definition (or `text`), checked against the effects and conditions we have."""
    if text is None:
        text, source = definition_mod.default_text()
    return definition_mod.parse(text, source, effects=EFFECTS, conditions=CONDITIONS)


class Lifecycle:
    """The model `transitions` drives; its `state` mirrors the state file's."""

    state: str


class Controller:
    def __init__(self, definition: Definition, store: Store, host: Host,
                 *, history_limit: int = 200) -> None:
        self.definition = definition
        self.store = store
        self.host = host
        self.history_limit = history_limit
        self.model = Lifecycle()
        # Called as failpoint(trigger, k) before the k-th effect (and with k == len(effects)
        # before the final record): tests crash there; $AGENT_FSM_FAILPOINT kills the process.
        self.failpoint: Callable[[str, int], None] = env_failpoint
        self._doc: StateDoc | None = None
        self._args: dict[str, Any] = {}
        self._machine: Machine | None = None

    @property
    def machine(self) -> Machine:
        """The `transitions` machine, built on first use: readers (`status`) never need it."""
        if self._machine is None:
            from transitions import Machine

            machine = Machine(
                model=self.model,
                states=list(self.definition.state_names),
                initial=self.definition.initial,
                auto_transitions=False,
                send_event=True,
                ignore_invalid_triggers=False,
            )
            for t in self.definition.transitions:
                machine.add_transition(
                    t.trigger, list(t.sources), t.dest,
                    conditions=[self._condition(name) for name in t.conditions],
                    before=[self._run],
                )
            self._machine = machine
        return self._machine

    # Writing ------------------------------------------------------------------------------
    def fire(self, trigger: str, **args: Any) -> StateDoc:
        """Run one transition to its end, under the lock; resume owed effects first."""
        from transitions import MachineError

        if trigger not in {t.trigger for t in self.definition.transitions}:
            raise AgentFsmError(f"{trigger!r} is not a trigger of {self.definition.name}")
        with self.store.locked():
            doc = self._resumed(self.store.read())
            self.machine.set_state(doc.state, model=self.model)
            self._doc = doc
            self._args = self.host.prepare(args)
            try:
                getattr(self.model, trigger)()
            except MachineError:
                raise self._illegal(trigger, doc) from None
            finally:
                self._doc = None
            return doc

    def resume(self) -> StateDoc:
        """Finish a transition a crash left owed; return the (possibly unchanged) state."""
        with self.store.locked():
            return self._resumed(self.store.read())

    def allowed(self, state: str) -> tuple[str, ...]:
        return self.definition.triggers_from(state)

    # Internals ----------------------------------------------------------------------------
    def _condition(self, name: str) -> Any:
        check = CONDITIONS[name]

        def run(event: EventData) -> bool:
            assert self._doc is not None
            dest = self.definition.transition(event.event.name).dest
            pending = Pending(event.event.name, self._doc.state, dest, [], 0, self._args, 0.0)
            check(self.host, Step(self._doc, pending))  # raises with the reason when it fails
            return True

        return run

    def _run(self, event: EventData) -> None:
        doc = self._doc
        assert doc is not None
        t = self.definition.transition(event.event.name)
        args = dict(self._args)
        if doc.upgrade is not None:  # kept for the history entry, though effects may clear it
            args["upgrade"] = {"from": doc.upgrade.from_version, "to": doc.upgrade.to_version}
        doc.pending = Pending(
            trigger=t.trigger, source=doc.state, dest=t.dest,
            effects=[e.name for e in t.effects], done=0, args=args,
            started=float(args["started"]),
        )
        if doc.pending.effects:
            # Write-ahead: the effects owed are durable before any runs. A transition without
            # effects has nothing to resume: its one record is the final one.
            self.store.write(doc)
        self._finish(doc)

    def _resumed(self, doc: StateDoc) -> StateDoc:
        if doc.pending is not None:
            log.warning("resuming %s (%s -> %s) at effect %d of %d, left owed by an "
                        "interrupted run", doc.pending.trigger, doc.pending.source,
                        doc.pending.dest, doc.pending.done + 1, len(doc.pending.effects))
            self._finish(doc)
        return doc

    def _finish(self, doc: StateDoc) -> None:
        pending = doc.pending
        assert pending is not None
        t = self.definition.transition(pending.trigger)
        tolerant = {e.name for e in t.effects if e.tolerant}
        step = Step(doc, pending)
        while pending.done < len(pending.effects):
            self.failpoint(pending.trigger, pending.done)
            name = pending.effects[pending.done]
            try:
                EFFECTS[name](self.host, step)
            except AgentFsmError as exc:
                if name not in tolerant:
                    raise
                log.error("%s failed during %s and was skipped: %s", name, pending.trigger, exc)
            pending.done += 1
            self.store.write(doc)
        self.failpoint(pending.trigger, pending.done)
        up = doc.upgrade
        versions = pending.args.get("upgrade") or (
            None if up is None else {"from": up.from_version, "to": up.to_version})
        entry = {
            "time": self.host.clock.now(),
            "trigger": pending.trigger,
            "from": pending.source,
            "to": pending.dest,
            "release": pending.args.get("release"),
            "upgrade": versions,
        }
        # Counted in the same write that records the transition: exactly once, crash or not.
        counted = counters.from_history(doc.history) if doc.counters is None \
            else counters.Counters(**doc.counters)
        doc.counters = counters.to_json(counters.tally(counted, entry))
        doc.history.append(entry)
        del doc.history[:-self.history_limit]
        doc.state = pending.dest
        doc.pending = None
        self.store.write(doc)

    def _illegal(self, trigger: str, doc: StateDoc) -> IllegalTransition:
        allowed = ", ".join(self.allowed(doc.state)) or "none"
        why = situation(doc)
        return IllegalTransition(
            f"can't {trigger} while {doc.state}: {why} (allowed now: {allowed})",
            trigger=trigger, state=doc.state,
        )


def situation(doc: StateDoc) -> str:
    """One line on what is going on in this state, for refusals and status."""
    up = doc.upgrade
    to = up.to_version if up else "?"
    frm = up.from_version if up else "?"
    return {
        "idle": "nothing is installed yet; run `agent-fsm install --version V`",
        "candidate_running": f"an upgrade to {to} is being judged",
        "judged_ok": f"the upgrade to {to} passed and its result is being published",
        "judged_failed": f"the upgrade to {to} failed; recovery to {frm} is starting",
        "recovering": f"the upgrade to {to} failed; rolling back to {frm}",
        "converged": "no upgrade is pending",
    }.get(doc.state, doc.state)
