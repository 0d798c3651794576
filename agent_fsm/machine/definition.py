"""The machine as data: load `states/agent-upgrade.toml` into plain records and check it.

Loading refuses, naming the culprits: not exactly one initial state; undeclared states; unknown
conditions or effects; a trigger declared twice; unreachable states or ones without a way out; a
state not declaring its `on_start` and `on_recover`; a transition without roles (`by`, from
`Role`).
"""

from __future__ import annotations

import enum
import tomllib
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from ..errors import DefinitionError

if TYPE_CHECKING:
    from ..node.state.document import StateDoc

DEFINITION_NAME = "agent-upgrade.toml"


# NamedTuples, not dataclasses: `status` loads the definition (docs/design.md).
class Effect(NamedTuple):
    """One effect a transition runs; a `tolerant` one logs its failure instead of raising it.

    `done_at_own_start`: a start of the agent unit counts it as done (`restart_unit`: that start
    is the restart).
    """

    name: str
    tolerant: bool = False
    done_at_own_start: bool = False


class Role(enum.StrEnum):
    """Which process may fire a transition (its `by`); only the last-good's code runs the way back."""

    operator = "operator"  # an operator's command: install, activate, upgrade
    candidate = "candidate"  # the daemon started from the pending upgrade's candidate release
    last_good = "last_good"  # the daemon started from the last-good release
    recovery = "recovery"  # `agent-fsm recover`, run from the last-good's release (its script)


# Whose code each role runs: a transition left owed is finished by a role of the same code.
CODE: dict[Role, str] = {Role.operator: "operator", Role.candidate: "candidate",
                         Role.last_good: "last_good", Role.recovery: "last_good"}


class OnStart(enum.StrEnum):
    """What a daemon start does from a state (its `on_start`), after resuming and orphan rollback."""

    refuse_not_installed = "refuse_not_installed"
    judge_candidate = "judge_candidate"
    publish_then_open_gate = "publish_then_open_gate"
    start_recovery_unit = "start_recovery_unit"
    finish_recovery = "finish_recovery"
    converge_then_open_gate = "converge_then_open_gate"


class OnRecover(enum.StrEnum):
    """What `agent-fsm recover` does from a state (its `on_recover`), after the same two steps."""

    roll_back = "roll_back"
    nothing_completing = "nothing_completing"
    nothing_pending = "nothing_pending"


# In words, for the generated page (diagrams/agent-upgrade.md).
MEANINGS: dict[str, str] = {
    OnStart.refuse_not_installed: "log that nothing is installed and exit 1 (so does a start "
                                  "from any state with no release selected)",
    OnStart.judge_candidate: "hold the last-good's assets, count the attempt and judge the "
                             "candidate: passed, as `publish_then_open_gate`; failed, record "
                             "the result, start the recovery unit and exit 1",
    OnStart.publish_then_open_gate: "publish the result (retried until it is delivered, or "
                                    "until `publish_give_up_seconds` have passed since the "
                                    "judgment: then `complete_queued` queues it in the outbox), "
                                    "clear the signal, write the assets, then open the gate",
    OnStart.start_recovery_unit: "start the recovery unit and exit 1",
    OnStart.finish_recovery: "with the last-good selected, clear the signal, write the assets "
                             "that differ and open the gate; else as `start_recovery_unit`",
    OnStart.converge_then_open_gate: "rewrite the assets that differ, then open the gate",
    OnRecover.roll_back: "roll back to the last-good: select it and restart it",
    OnRecover.nothing_completing: "nothing to roll back: the upgrade was judged ok and is "
                                  "completing",
    OnRecover.nothing_pending: "nothing to roll back: no upgrade is pending",
}


Action = TypeVar("Action", OnStart, OnRecover)
Handler = TypeVar("Handler")
KEYS: dict[type[enum.StrEnum], str] = {OnStart: "on_start", OnRecover: "on_recover"}


def handlers(kind: type[Action], table: Mapping[Action, Handler],
             owner: str) -> Mapping[Action, Handler]:
    """`table` as `owner`'s dispatch by `kind`; a missing handler fails when `owner` is loaded."""
    missing = set(kind) - set(table)
    if missing:
        raise DefinitionError(f"{owner} has no handler for {KEYS[kind]} "
                              f"{_listing(missing)}; add one")
    return table


class State(NamedTuple):
    name: str
    description: str
    situation: str  # one line on what is going on; may name {from} and {to}
    on_start: OnStart
    on_recover: OnRecover


class Transition(NamedTuple):
    trigger: str
    sources: tuple[str, ...]
    dest: str
    conditions: tuple[str, ...]
    effects: tuple[Effect, ...]
    description: str
    supersedes: tuple[str, ...] = ()  # owed transitions it may replace instead of resuming
    by: tuple[Role, ...] = tuple(Role)  # the roles whose process may fire it

    @property
    def effect_names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.effects)

    def may_finish(self, role: Role) -> bool:
        """Whether a process of `role` may finish this transition when a crash left it owed.

        Yes if a role of the same release's code may fire it, or if it is the operator's: its
        arguments are fixed, and the next start finishes it once the command is gone.
        """
        return Role.operator in self.by or CODE[role] in {CODE[r] for r in self.by}


class Definition(NamedTuple):
    name: str
    initial: str
    states: tuple[State, ...]
    transitions: tuple[Transition, ...]
    source: str

    @property
    def state_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.states)

    def state(self, name: str) -> State:
        for s in self.states:
            if s.name == name:
                return s
        raise KeyError(name)

    def transition(self, trigger: str) -> Transition:
        for t in self.transitions:
            if t.trigger == trigger:
                return t
        raise KeyError(trigger)

    def triggers_from(self, state: str) -> tuple[str, ...]:
        return tuple(t.trigger for t in self.transitions if state in t.sources)

    def finished_for_a_dead_command(self, trigger: str, args: Mapping[str, Any]) -> bool:
        """Whether the daemon restarts its unit to finish this owed transition of a gone command.

        Only the operator's (`by`), except `install --no-start`.
        """
        known = any(t.trigger == trigger for t in self.transitions)
        return known and self.transition(trigger).by == (Role.operator,) \
            and not args.get("no_start")


def default_text() -> tuple[str, str]:
    """The shipped definition's text and where it came from: `agent_fsm/states/` beside this module.

    agent-fsm never runs from a zip, and `importlib.resources` would cost every start ~1 MB.
    """
    shipped = Path(__file__).parent.parent / "states" / DEFINITION_NAME
    try:
        return shipped.read_text(encoding="utf-8"), str(shipped)
    except (FileNotFoundError, NotADirectoryError):
        raise DefinitionError(
            f"the machine definition {DEFINITION_NAME} is missing from the package ({shipped}); "
            "reinstall agent-fsm"
        ) from None


def _names(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise DefinitionError(f"{where} must be a name or a list of names, not {value!r}")


def _effects(value: Any, where: str) -> tuple[Effect, ...]:
    if not isinstance(value, list):
        raise DefinitionError(f"{where} must be a list, not {value!r}")
    out: list[Effect] = []
    for item in value:
        if isinstance(item, str):
            out.append(Effect(item))
        elif (isinstance(item, dict) and set(item) <= {"name", "on_error", "at_own_start"}
              and "name" in item):
            on_error = item.get("on_error", "fail")
            if on_error not in ("fail", "log"):
                raise DefinitionError(f"{where}: on_error must be 'fail' or 'log', not {on_error!r}")
            at_start = item.get("at_own_start", "run")
            if at_start not in ("run", "done"):
                raise DefinitionError(f"{where}: at_own_start must be 'run' or 'done', not "
                                      f"{at_start!r}")
            out.append(Effect(str(item["name"]), tolerant=on_error == "log",
                              done_at_own_start=at_start == "done"))
        else:
            raise DefinitionError(f"{where}: an effect is a name or {{ name, on_error, "
                                  f"at_own_start }}: {item!r}")
    return tuple(out)


# The one effect that a start of the agent unit may count as done when it resumes it.
AT_OWN_START = frozenset({"restart_unit"})


def _roles(value: Any, where: str) -> tuple[Role, ...]:
    """A transition's `by`: one or more roles of `Role`, each once."""
    if value is None:
        raise DefinitionError(f"{where} names no role that may fire it; add `by = [...]` with "
                              f"one or more of: {_listing(Role)}")
    names = _names(value, where)
    unknown = set(names) - set(Role)
    if unknown or not names or len(set(names)) != len(names):
        what = (f"unknown role(s) {_listing(unknown)}" if unknown else
                "no role" if not names else "a role more than once")
        raise DefinitionError(f"{where} names {what}; roles: {_listing(Role)}")
    return tuple(Role(n) for n in names)


def _listing(names: Iterable[str]) -> str:
    return ", ".join(sorted(set(names)))


def _declared(raw_states: dict[str, Any], key: str, known: type[enum.StrEnum],
              source: str) -> None:
    """Refuse states that declare no `key`, or a name outside `known`, naming them."""
    lacking = [n for n, body in raw_states.items() if key not in body]
    if lacking:
        raise DefinitionError(f"{source}: these states declare no {key}: {_listing(lacking)}; "
                              f"each declares one of: {_listing(known)}")
    for n, body in raw_states.items():
        if not isinstance(body[key], str) or body[key] not in set(known):
            raise DefinitionError(f"{source}: state {n!r} declares {key} = {body[key]!r}, "
                                  f"which is not one of: {_listing(known)}")


def parse(text: str, source: str, *, effects: Collection[str],
          conditions: Collection[str]) -> Definition:
    """Parse and check a definition; `effects` and `conditions` are the names the runtime has."""
    return checked(loads(text, source), source, effects=effects, conditions=conditions)


def loads(text: str, source: str) -> dict[str, Any]:
    """A definition's TOML as data, for `checked` (a reader looks at it first)."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DefinitionError(f"{source} is not valid TOML: {exc}") from None


def checked(data: dict[str, Any], source: str, *, effects: Collection[str],
            conditions: Collection[str]) -> Definition:
    """Check a definition's data (`loads`) and build it; as `parse`, without parsing again."""
    unknown = set(data) - {"machine", "states", "transitions"}
    if unknown:
        raise DefinitionError(f"{source}: unknown table(s) {_listing(unknown)}")
    machine = data.get("machine", {})
    name, initial = machine.get("name"), machine.get("initial")
    if not isinstance(name, str) or not isinstance(initial, str):
        raise DefinitionError(f"{source}: [machine] needs `name` and exactly one `initial` state")
    raw_states = data.get("states", {})
    for n, body in raw_states.items():
        extra = set(body) - {"description", "situation", "on_start", "on_recover"}
        if extra:
            raise DefinitionError(f"{source}: state {n!r}: unknown key(s) {_listing(extra)}")
    _declared(raw_states, "on_start", OnStart, source)
    _declared(raw_states, "on_recover", OnRecover, source)
    states = tuple(
        State(n, str(body.get("description", "")), str(body.get("situation", "")),
              OnStart(body["on_start"]), OnRecover(body["on_recover"]))
        for n, body in raw_states.items()
    )
    declared = {s.name for s in states}
    if initial not in declared:
        raise DefinitionError(f"{source}: the initial state {initial!r} is not declared")

    transitions: list[Transition] = []
    seen: set[str] = set()
    for i, raw in enumerate(data.get("transitions", [])):
        where = f"{source}: transition #{i + 1}"
        extra = set(raw) - {"trigger", "source", "dest", "conditions", "effects", "description",
                            "supersedes", "by"}
        if extra:
            raise DefinitionError(f"{where}: unknown key(s) {_listing(extra)}")
        trigger = raw.get("trigger")
        if not isinstance(trigger, str):
            raise DefinitionError(f"{where} has no trigger")
        where = f"{source}: transition {trigger!r}"
        if trigger in seen:
            raise DefinitionError(f"{source}: trigger {trigger!r} is declared more than once")
        seen.add(trigger)
        t = Transition(
            trigger=trigger,
            sources=_names(raw.get("source"), f"{where} source"),
            dest=str(raw.get("dest")),
            conditions=_names(raw.get("conditions", []), f"{where} conditions"),
            effects=_effects(raw.get("effects", []), f"{where} effects"),
            description=str(raw.get("description", "")),
            supersedes=_names(raw.get("supersedes", []), f"{where} supersedes"),
            by=_roles(raw.get("by"), f"{where} by"),
        )
        undeclared = (set(t.sources) | {t.dest}) - declared
        if undeclared:
            raise DefinitionError(f"{where} names undeclared state(s): {_listing(undeclared)}")
        bad_conditions = set(t.conditions) - set(conditions)
        if bad_conditions:
            raise DefinitionError(
                f"{where} names unknown condition(s): {_listing(bad_conditions)}; "
                f"known: {_listing(conditions)}"
            )
        bad_effects = {e.name for e in t.effects} - set(effects)
        if bad_effects:
            raise DefinitionError(
                f"{where} names unknown effect(s): {_listing(bad_effects)}; "
                f"known: {_listing(effects)}"
            )
        not_at_start = {e.name for e in t.effects if e.done_at_own_start} - AT_OWN_START
        if not_at_start:
            raise DefinitionError(
                f"{where}: at_own_start = \"done\" is for {_listing(AT_OWN_START)} only, not "
                f"{_listing(not_at_start)}: a start of the agent unit is no other effect")
        transitions.append(t)

    triggers = {t.trigger for t in transitions}
    for t in transitions:
        unknown_owed = set(t.supersedes) - triggers
        if unknown_owed:
            raise DefinitionError(f"{source}: transition {t.trigger!r} supersedes unknown "
                                  f"trigger(s): {_listing(unknown_owed)}")
    reachable = {initial}
    frontier = [initial]
    while frontier:
        here = frontier.pop()
        for t in transitions:
            if here in t.sources and t.dest not in reachable:
                reachable.add(t.dest)
                frontier.append(t.dest)
    unreachable = declared - reachable
    if unreachable:
        raise DefinitionError(
            f"{source}: these states cannot be reached from {initial!r}: {_listing(unreachable)}"
        )
    trapped = {
        s for s in declared
        if not any(s in t.sources and t.dest != s for t in transitions)
    }
    if trapped:
        raise DefinitionError(f"{source}: these states have no way out: {_listing(trapped)}")
    return Definition(name, initial, states, tuple(transitions), source)


def situation(d: Definition, doc: StateDoc) -> str:
    """One line on what is going on in the document's state, for refusals and status."""
    up = doc.upgrade
    text = d.state(doc.state).situation or doc.state
    return text.format_map({"to": up.to_version if up else "?",
                            "from": up.from_version if up else "?"})
