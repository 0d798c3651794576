"""The lifecycle machine: the declared definition, run by `transitions`, made crash-safe.

`Controller.fire(trigger)` takes the writers' lock and resumes what a crash left owed.
`transitions` checks the trigger's sources and conditions (else IllegalTransition). The
transition and its effects are recorded first (write-ahead), the effects run with progress
recorded after each, then the new state and a history entry are recorded. From a crash anywhere,
`resume` reaches the same end.

The controller fires only transitions whose `by` names its process's role, and finishes an owed
one only if that role may (`Transition.may_finish`); else NotItsRole, before any write. This
alone enforces "only the last-good's code runs the way back".
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import AgentFsmError, IllegalTransition, NotItsRole, StateFileError
from ..node.state import counters, reasons
from ..node.state.store import Pending, StateDoc, Store
from ..system.clock import Clock
from .definition import Definition, Role, situation
from .hooks import Hooks, NoHooks, ask, before_triggers, finished, telling
from .vocabulary import COMMANDS, RESULT_EFFECTS, Groups, count_rules, groups

if TYPE_CHECKING:
    from transitions import EventData, Machine

log = logging.getLogger("agent_fsm")


FAILPOINT_ENV = "AGENT_FSM_FAILPOINT"


def env_failpoint(trigger: str, index: int) -> None:
    """Kill this process with SIGKILL at `$AGENT_FSM_FAILPOINT` ("trigger:index"), for tests."""
    if os.environ.get(FAILPOINT_ENV) == f"{trigger}:{index}":
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class Step:
    """What a condition or effect sees: the state document, the transition and its fixed arguments."""

    doc: StateDoc
    trigger: str
    dest: str
    args: dict[str, Any] = field(default_factory=dict)

    def arg(self, name: str) -> Any:
        return self.args.get(name)


class Effectors(Protocol):
    """What effects act through (`upgrade.effectors` makes them): a clock, and `prepare`, which
    fixes their values before recording."""

    clock: Clock

    def prepare(self, args: dict[str, Any]) -> dict[str, Any]: ...


class Process(Protocol):
    """The process a controller runs in, as far as the roles go (`upgrade.roles` makes it)."""

    release: str | None  # the release whose code it runs, when known

    def role(self, doc: StateDoc) -> Role | None:
        """Its role now, by the state and the node's releases; None: no role at all."""

    def own_start(self) -> bool:
        """Whether it is a start of the agent unit running the release selected now."""

    def __str__(self) -> str: ...


# What the engine is given to run, by name: effects act, conditions answer (None when they
# hold, else the error that refuses). Their first argument is the effectors they act through.
EffectFn = Callable[[Any, Step], None]
ConditionFn = Callable[[Any, Step], AgentFsmError | None]


class Lifecycle:
    """The model `transitions` drives; its `state` mirrors the state file's."""

    state: str


class Controller:
    """Runs the definition's transitions on a store, with the effects and conditions given."""

    def __init__(self, definition: Definition, store: Store, effectors: Effectors, *,
                 effects: Mapping[str, EffectFn], conditions: Mapping[str, ConditionFn],
                 history_limit: int = 200, hooks: Hooks | None = None,
                 process: Process | None = None) -> None:
        self.definition = definition
        self.store = store
        self.effectors = effectors
        self.effects = effects
        self.conditions = conditions
        self.history_limit = history_limit
        self.model = Lifecycle()
        # Called as failpoint(trigger, k) before the k-th effect (and with k == len(effects)
        # before the final record): tests crash there; $AGENT_FSM_FAILPOINT kills the process.
        self.failpoint: Callable[[str, int], None] = env_failpoint
        # Hooks: `before` for operator-started triggers only (never the way back); `after`
        # for transitions recorded by this run, told once the lock is released.
        self.hooks: Hooks = hooks if hooks is not None else NoHooks()
        self._finished: list[dict[str, Any]] = []
        # None: any role (tests, tools); else every fire and finish is checked against `by`.
        self.process = process
        # Read off the definition once, when the machine is built.
        self.groups: Groups = groups(definition)
        self.count_rules = count_rules(definition, self.groups)
        self.before_triggers = before_triggers(definition)
        self._transitions = {t.trigger: t for t in definition.transitions}
        self.trigger_names = frozenset(self._transitions)  # all triggers
        self.machine: Machine = self._built()

    def _built(self) -> Machine:
        """The `transitions` machine with its conditions bound, built with the controller.

        Triggers get `doc`, `args` and `refusals`, where a failing condition leaves its reason.
        """
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
        return machine

    # Writing ------------------------------------------------------------------------------
    def fire(self, trigger: str, **args: Any) -> StateDoc:
        """Run one transition to its end, under the lock; resume owed effects first."""
        from transitions import MachineError

        if trigger not in self.trigger_names:
            raise AgentFsmError(f"{trigger!r} is not a trigger of {self.definition.name}")
        asked = self._before(trigger, args)
        with telling(self.hooks, self._finished), self.store.locked():
            doc = self.store.read()
            self._check_role(trigger, doc, fire=True)
            # Recorded with the write-ahead of the transition that replaces it, in one write: a
            # failure between the two would leave neither owed (a signal the state no longer
            # knows, which the way back takes for an orphan).
            superseded = [self._supersede(doc, trigger)] if self.supersedes(trigger, doc) else []
            doc = self._resumed(doc)
            self.machine.set_state(doc.state, model=self.model)
            refusals: list[AgentFsmError] = []
            try:
                try:
                    fired = getattr(self.model, trigger)(
                        doc=doc, args=self.effectors.prepare(args), refusals=refusals, asked=asked,
                        superseded=superseded)
                except MachineError:
                    raise self._illegal(trigger, doc) from None
            finally:
                if superseded and doc.pending is None:  # not fired: the supersession alone
                    self.store.record(doc, superseded.pop(), self.history_limit)
            if not fired:
                raise refusals[0]
            return doc

    def supersedes(self, trigger: str, doc: StateDoc) -> bool:
        """Whether `trigger` replaces the owed transition instead of resuming it.

        It does when declared in `supersedes`, or, for a trigger that declares any (the way
        back), when the owed transition is a later agent-fsm's (`unknown`).
        """
        t = self._transitions[trigger]
        pending = doc.pending
        return pending is not None and doc.state in t.sources and (
            pending.trigger in t.supersedes or bool(t.supersedes and self.unknown(pending)))

    def unknown(self, pending: Pending) -> list[str]:
        """The names of an owed transition this agent-fsm does not know; none when it can resume it."""
        names = [] if pending.trigger in self.trigger_names else [f"trigger {pending.trigger}"]
        names += [f"state {s}" for s in dict.fromkeys((pending.source, pending.dest))
                  if s not in self.machine.states]
        names += [f"effect {e}" for e in dict.fromkeys(pending.effects) if e not in self.effects]
        return names

    def _supersede(self, doc: StateDoc, by: str) -> dict[str, Any]:
        """Drop the owed transition `by` replaces; return its history entry, to record."""
        pending = doc.pending
        assert pending is not None
        unknown = self.unknown(pending)
        log.warning("%s supersedes %s, left owed at effect %d of %d (%s not run)%s", by,
                    pending.trigger, pending.done + 1, len(pending.effects),
                    ", ".join(pending.effects[pending.done:]),
                    f", written by a later agent-fsm ({', '.join(unknown)} unknown here)"
                    if unknown else "")
        # In the history, not counted: the transition did not happen; the state is unchanged.
        doc.pending = None
        return {
            "time": self.effectors.clock.now(), "trigger": pending.trigger, "from": doc.state,
            "to": doc.state, "release": pending.args.get("release"),
            "upgrade": pending.args.get("upgrade"), "superseded_by": by,
            **({"unknown": unknown} if unknown else {}),
        }

    def resume(self) -> StateDoc:
        """Finish a transition a crash left owed; return the (possibly unchanged) state."""
        with telling(self.hooks, self._finished), self.store.locked():
            return self._resumed(self.store.read())

    def allowed(self, state: str) -> tuple[str, ...]:
        """The triggers `transitions` has from `state`, in the definition's order."""
        return tuple(self.machine.get_triggers(state))

    # Internals ----------------------------------------------------------------------------
    def _condition(self, name: str) -> Callable[[EventData], bool]:
        check = self.conditions[name]

        def holds(event: EventData) -> bool:
            trigger = event.event.name
            step = Step(event.kwargs["doc"], trigger, self._transitions[trigger].dest,
                        event.kwargs["args"])
            refusal = check(self.effectors, step)
            if refusal is not None:
                event.kwargs["refusals"].append(refusal)
            return refusal is None

        return holds

    def _run(self, event: EventData) -> None:
        doc: StateDoc = event.kwargs["doc"]
        t = self._transitions[event.event.name]
        args = dict(event.kwargs["args"])
        if not event.kwargs["asked"]:  # the state changed since `_before` looked: ask now
            ask(self.hooks, t.trigger, doc.state, t.dest, args)
        if doc.upgrade is not None:  # kept for the history entry, though effects may clear it
            args["upgrade"] = {"from": doc.upgrade.from_version, "to": doc.upgrade.to_version}
        doc.pending = Pending(
            trigger=t.trigger, source=doc.state, dest=t.dest,
            effects=[e.name for e in t.effects], done=0, args=args,
            started=float(args["started"]),
        )
        superseded: list[dict[str, Any]] = event.kwargs["superseded"]
        if superseded:  # with the write-ahead, or before the final record of one without
            owed = doc.pending
            doc.pending = owed if owed.effects else None
            self.store.record(doc, superseded.pop(), self.history_limit)
            doc.pending = owed
        elif doc.pending.effects:
            # Write-ahead: the effects owed are durable before any runs. A transition without
            # effects has nothing to resume: its one record is the final one.
            self.store.write(doc)
        self._finish(doc)

    def _check_role(self, trigger: str, doc: StateDoc, *, fire: bool) -> None:
        """Raise NotItsRole, touching nothing, unless this process may fire (or finish) `trigger`."""
        if self.process is None:
            return
        t = self._transitions[trigger]
        role = self.process.role(doc)
        if role is not None and (role in t.by if fire else t.may_finish(role)):
            return
        whose = " or ".join(f"the {r.replace('_', '-')}'s" for r in t.by)
        what = f"fire {trigger}" if fire else f"finish the interrupted {trigger}"
        raise NotItsRole(
            f"{self.process} ({'no role' if role is None else 'the ' + role.replace('_', '-')}) "
            f"may not {what}: it is {whose} to run (`by` in {self.definition.source}); the "
            f"state ({doc.state}) was left as it is",
            trigger=trigger, role=role)

    def _resumed(self, doc: StateDoc) -> StateDoc:
        if doc.pending is not None and (unknown := self.unknown(doc.pending)):
            raise StateFileError(
                f"the state file {self.store.path} owes {doc.pending.trigger} ({doc.state} -> "
                f"{doc.pending.dest}), written by a later agent-fsm: {', '.join(unknown)} "
                "unknown here, so this one cannot finish it; on the way back `agent-fsm "
                "recover` supersedes it; else run the agent-fsm that wrote it")
        if doc.pending is not None:
            self._check_role(doc.pending.trigger, doc, fire=False)
            log.warning("resuming %s (%s -> %s) at effect %d of %d, left owed by an "
                        "interrupted run", doc.pending.trigger, doc.pending.source,
                        doc.pending.dest, doc.pending.done + 1, len(doc.pending.effects))
            self._finish(doc, resuming=True)
        return doc

    def _finish(self, doc: StateDoc, *, resuming: bool = False) -> None:
        pending = doc.pending
        assert pending is not None
        t = self._transitions[pending.trigger]
        tolerant = {e.name for e in t.effects if e.tolerant}
        # Owed before this process looked, and declared done by a start of the unit it restarts.
        at_start = {e.name for e in t.effects if e.done_at_own_start} if resuming else set()
        skipped: list[dict[str, str]] = []  # failures let pass, kept in the history entry
        step = Step(doc, pending.trigger, pending.dest, pending.args)
        while pending.done < len(pending.effects):
            self.failpoint(pending.trigger, pending.done)
            name = pending.effects[pending.done]
            try:
                if name in at_start and self.process is not None and self.process.own_start():
                    log.info("%s of the interrupted %s counts as done: this start of the unit "
                             "is that restart", name, pending.trigger)
                else:
                    self.effects[name](self.effectors, step)
            except AgentFsmError as exc:
                if name not in tolerant:
                    raise
                log.error("%s failed during %s and was skipped: %s", name, pending.trigger, exc)
                skipped.append({"effect": name, "error": str(exc)})
            pending.done += 1
            self.store.write(doc)
        self.failpoint(pending.trigger, pending.done)
        up = doc.upgrade
        versions = pending.args.get("upgrade") or (
            None if up is None else {"from": up.from_version, "to": up.to_version})
        entry = {
            "time": self.effectors.clock.now(),
            "trigger": pending.trigger,
            "from": pending.source,
            "to": pending.dest,
            "release": pending.args.get("release"),
            "upgrade": versions,
            **({"skipped": skipped} if skipped else {}),
            # A start systemd made after a crash (`restarts`: its count of them): the store
            # records a crash loop as one entry.
            **({"restarts": 1} if pending.args.get("restarts") else {}),
            **reasons.entry_keys(doc.last_result, set(RESULT_EFFECTS) & set(t.effect_names)),
        }
        # Counted in the same write that records the transition: exactly once, crash or not.
        # A later agent-fsm's counters are kept as they are.
        mine = {k: v for k, v in (doc.counters or {}).items() if k in counters.Counters._fields}
        counted = counters.Counters(**mine)
        doc.counters = {**(doc.counters or {}),
                        **counters.to_json(counters.tally(counted, entry, self.count_rules))}
        doc.state = pending.dest
        doc.pending = None
        self.store.record(doc, entry, self.history_limit)  # the journal, then the state file
        self._finished.append(finished(entry, pending.args, t.effect_names, doc.last_result))

    # Hooks --------------------------------------------------------------------------------
    def _before(self, trigger: str, args: dict[str, Any]) -> bool:
        """Run the trigger's `before` hook outside the lock, so a slow hook never holds up the daemon.

        A refusal is raised. False: not asked, as the trigger may not fire now; `_run` asks
        under the lock.
        """
        if trigger not in self.before_triggers or not self.hooks.has_before(trigger):
            return True
        doc = self.store.read()
        prepared = self.effectors.prepare(args)
        if doc.pending is not None:  # resumed first, under the lock: the state may change
            return False
        self.machine.set_state(doc.state, model=self.model)
        if not getattr(self.model, f"may_{trigger}")(doc=doc, args=prepared, refusals=[]):
            return False
        ask(self.hooks, trigger, doc.state, self._transitions[trigger].dest, prepared)
        return True

    def _illegal(self, trigger: str, doc: StateDoc) -> IllegalTransition:
        why = situation(self.definition, doc)
        allowed = self.allowed(doc.state)
        if trigger in COMMANDS:  # a user's command: say it, and the ones that may run now
            can = ", ".join(f"`agent-fsm {COMMANDS[t]}`" for t in allowed if t in COMMANDS)
            return IllegalTransition(
                f"can't {COMMANDS[trigger]} now: {why} (" + (
                    f"you can run {can})" if can else "no install, activate, upgrade or recover "
                    "may run now; `agent-fsm status` says when)"),
                trigger=trigger, state=doc.state)
        return IllegalTransition(
            f"can't {trigger} while {doc.state}: {why} (allowed now: {', '.join(allowed) or 'none'})",
            trigger=trigger, state=doc.state,
        )

