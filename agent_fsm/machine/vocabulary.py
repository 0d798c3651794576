"""State and trigger names as one typed vocabulary, and groups of states read off the definition.

`check_vocabulary` runs at load: a name the code uses that the definition lacks is an error, so
a renamed state cannot silently drop out of a comparison.
"""

from __future__ import annotations

import enum
import functools
from typing import NamedTuple

from ..errors import DefinitionError
from ..node.state.counters import CountRules
from .definition import Definition, OnRecover, OnStart, Role


class StateName(enum.StrEnum):
    idle = "idle"
    candidate_running = "candidate_running"
    judged_ok = "judged_ok"
    judged_failed = "judged_failed"
    recovering = "recovering"
    converged = "converged"


class Trigger(enum.StrEnum):
    install = "install"
    activate = "activate"
    begin_upgrade = "begin_upgrade"
    candidate_started = "candidate_started"
    judge_ok = "judge_ok"
    judge_failed = "judge_failed"
    complete = "complete"
    complete_queued = "complete_queued"
    recover = "recover"
    abandon_upgrade = "abandon_upgrade"
    recovered = "recovered"
    orphaned_signal = "orphaned_signal"
    settle = "settle"


# The command (`agent-fsm COMMAND`) that fires each trigger an operator fires, and `recover`'s:
# what refusals and `status` say instead of a trigger's name. The others are the daemon's own,
# and no command of a user's fires them. Every trigger the definition gives the operator role
# must be here (`check_vocabulary`).
COMMANDS: dict[str, str] = {
    Trigger.install: "install",
    Trigger.activate: "activate",
    Trigger.begin_upgrade: "upgrade",
    Trigger.recover: "recover",
}


# The trigger a start or `recover` fires first from the state that declares the action (the
# others fire none): so a state cannot declare what its transitions do not allow.
FIRES: dict[str, Trigger] = {
    OnStart.judge_candidate: Trigger.candidate_started,
    OnStart.publish_then_open_gate: Trigger.complete,
    OnStart.finish_recovery: Trigger.recovered,
    OnStart.converge_then_open_gate: Trigger.settle,
    OnRecover.roll_back: Trigger.recover,
}


def check_vocabulary(d: Definition) -> None:
    """Refuse a definition lacking a name the code uses, or whose `on_start`/`on_recover` do not match."""
    states = set(StateName) - set(d.state_names)
    triggers = set(Trigger) - {t.trigger for t in d.transitions}
    if states or triggers:
        missing = [f"state {s}" for s in sorted(states)] + [f"trigger {t}" for t in sorted(triggers)]
        raise DefinitionError(f"{d.source} lacks what agent-fsm's code names: {', '.join(missing)}")
    wrong = [f"{s.name} ({key} = {action} fires {FIRES[action]})"
             for s in d.states for key, action in (("on_start", s.on_start),
                                                  ("on_recover", s.on_recover))
             if action in FIRES and s.name not in d.transition(FIRES[action]).sources]
    if wrong:
        raise DefinitionError(f"{d.source}: these states declare an action their transitions "
                              f"do not allow: {', '.join(wrong)}")
    unnamed = [t.trigger for t in d.transitions if Role.operator in t.by
               and t.trigger not in COMMANDS]
    if unnamed:
        raise DefinitionError(f"{d.source}: these operator triggers have no command "
                              f"(`vocabulary.COMMANDS`): {', '.join(unnamed)}")
    kept = set(d.transition(Trigger.recover).sources) - {
        s.name for s in d.states if s.on_recover == OnRecover.roll_back}
    if kept:
        raise DefinitionError(f"{d.source}: `recover` may roll back from these states but their "
                              f"on_recover is not {OnRecover.roll_back}: {', '.join(sorted(kept))}")


RESULT_EFFECTS = ("publish_result", "record_result")


def _dests(d: Definition, *effects: str) -> set[str]:
    return {t.dest for t in d.transitions if set(effects) & set(t.effect_names)}


class Groups(NamedTuple):
    """Groups of states (and transitions) read off the definition's effects."""

    pending: frozenset[str]  # an upgrade is pending: the signal is written and not yet cleared
    rolling_back: frozenset[str]  # the candidate was given up: recovery started or last-good selected
    recover_from: frozenset[str]  # where `recover` may start
    orphan_from: frozenset[str]  # where a signal the state file does not know is an orphan
    publishing: frozenset[tuple[str, str]]  # (trigger, source) that reports a new result
    cycle_starts: frozenset[str]  # triggers that start an install, an upgrade or a rollback

    def tone(self, state: str, initial: str) -> str:
        """How a state reads to an operator: "none", "ok", "busy" or "bad"."""
        if state == initial:
            return "none"
        if state in self.rolling_back:
            return "bad"
        return "busy" if state in self.pending else "ok"


# Derived once per definition (a definition never changes): the engine, the store and the
# hooks' check read the same facts.
@functools.lru_cache(maxsize=8)
def groups(d: Definition) -> Groups:
    # Pending: from where the signal is written, every state reached without clearing it.
    pending = _dests(d, "write_signal")
    frontier = list(pending)
    while frontier:
        here = frontier.pop()
        for t in d.transitions:
            if here in t.sources and "clear_signal" not in t.effect_names and t.dest not in pending:
                pending.add(t.dest)
                frontier.append(t.dest)
    # A result is new unless the upgrade in flight has reported one already: from a pending
    # state that a reporting transition leads to (recover after judge_failed reports nothing).
    reported = _dests(d, *RESULT_EFFECTS) & pending
    publishing = {
        (t.trigger, s) for t in d.transitions if set(RESULT_EFFECTS) & set(t.effect_names)
        for s in t.sources if s not in reported
    }
    return Groups(
        pending=frozenset(pending),
        rolling_back=frozenset(_dests(d, "start_recovery") | _dests(d, "select_last_good")),
        recover_from=frozenset(s for t in d.transitions if t.trigger == Trigger.recover
                               for s in t.sources),
        orphan_from=frozenset(s for t in d.transitions if t.trigger == Trigger.orphaned_signal
                              for s in t.sources),
        publishing=frozenset(publishing),
        # Close the gate from a settled state: an operation (or a rollback) begins there.
        cycle_starts=frozenset(t.trigger for t in d.transitions if "close_gate" in t.effect_names
                               and not set(t.sources) <= pending),
    )


@functools.lru_cache(maxsize=8)
def count_rules(d: Definition, g: Groups) -> CountRules:
    """Which finished transitions advance which lifetime counter."""
    ok = {(t, s) for t, s in g.publishing if d.transition(t).dest not in g.pending}
    return CountRules(
        upgrades_ok=frozenset(ok),
        upgrades_rolled_back=g.publishing - ok,
        rollbacks=frozenset(t.trigger for t in d.transitions if "clear_signal" in t.effect_names
                            and set(t.sources) & g.rolling_back),
        attempts=frozenset(t.trigger for t in d.transitions if "count_attempt" in t.effect_names),
        cycle_starts=g.cycle_starts,
    )
