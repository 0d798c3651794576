"""The mutation link: every one-step variant of states/agent-upgrade.toml that `make mutants`
makes (`agent_fsm_lab.mutants.variants`), model-checked at the `mutant` bound (the small one, on
systemd 252 and 257). A variant is *caught* when it is refused at load or breaks a rule;
*equivalent* when no rule breaks and every configuration reached shows the same as the shipped
definition's, on each systemd (the same set of what the node's files say and what the units
are: the same reachable behaviour; systemd's start count is left out where the agent unit has no
start limit, `observable`); *equivalent at rest* when no rule breaks anywhere and the
configurations the node rests in are the same (`at_rest`: the liveness goal), the difference
only on the way there (an order of effects a crash between them shows, a count kept twice);
neither where a configuration both searches reach rests elsewhere once the faults stop
(`rests_differ`: the sets may agree while a path ends where the shipped one's does not); else
it *survived*.

A variant's search ends at its first broken rule (`stop_at_first`); one on which the node
cannot even be installed (the first release's `install` fails) is caught. Two pre-passes need
no search: a variant the definition loader refuses is caught, and one that loads to the very
`Definition` the shipped text does is equivalent (the code reads nothing else of the text);
neither decides any of today's variants.
The searches run in worker processes (`jobs`), each started afresh (spawn) with its own
temporary directory; the shipped definition is one of the jobs, and it must keep every rule
(or no variant's verdict would mean anything).
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from agent_fsm.errors import AgentFsmError, DefinitionError
from agent_fsm.machine import definition as definition_mod

from .search import BOUNDS, Bound, check
from .units import KEY_AGENT_RESTARTS, KEY_LIMIT, KEY_STARTS

SHIPPED = "(the shipped definition)"
UNEXERCISED = "never exercised"  # in an equivalent's why: the changed transition never fired
AT_REST = "equivalent-at-rest"  # no rule broken, the same rest configurations, not the same way


@dataclass(frozen=True)
class Verdict:
    id: str
    outcome: str  # caught, equivalent, survived
    why: str
    seconds: float


@dataclass(frozen=True)
class Searched:
    """What one worker's search of one definition found (sent back to the parent)."""

    id: str
    refused: str  # why it did not load or run ("" when it did)
    broken: tuple[tuple[str, str, int], ...]  # (rule, what was seen, steps of its trace)
    behaviour: frozenset[Any]
    states: int
    seconds: float
    rests: frozenset[tuple[Any, Any]] = frozenset()  # (configuration, where it rests)
    moves: frozenset[tuple[str, str]] = frozenset()  # (trigger, from) of every transition fired
    refusals: frozenset[tuple[str, str]] = frozenset()  # (trigger, condition) that refused it


class ShippedBroken(AgentFsmError):
    """The shipped definition breaks a rule at the mutant bound: no variant can be judged."""


def variants() -> list[Any]:
    """The mutation gate's variants of the shipped definition text."""
    from .. import mutants as gate

    text, _ = definition_mod.default_text()
    return list(gate.variants(text))


def search(vid: str, text: str | None, bound: Bound, stop_at_first: bool) -> Searched:
    """Model-check the definition `text` (None: the shipped one) in this process."""
    from agent_fsm.upgrade import registry

    began = time.monotonic()
    _, source = definition_mod.default_text()
    if text is not None:
        try:
            registry.load_definition(text, source)
        except AgentFsmError as exc:
            return Searched(vid, f"refused at load: {exc}", (), frozenset(), 0,
                            time.monotonic() - began)
    refusals: set[tuple[str, str]] = set()
    with pytest.MonkeyPatch.context() as mp:
        if text is not None:
            mp.setattr(definition_mod, "default_text", lambda: (text, source))
        mp.setattr(registry, "CONDITIONS", {name: _recording(name, fn, refusals)
                                            for name, fn in registry.CONDITIONS.items()})
        try:
            result = check(bound, stop_at_first=stop_at_first)
        except AgentFsmError as exc:  # a reader's checks of the definition, or the set-up
            why = ("refused at load" if isinstance(exc, DefinitionError)
                   else "the node cannot be installed with it")
            return Searched(vid, f"{why}: {exc}", (), frozenset(), 0, time.monotonic() - began)
        except Exception as exc:
            return Searched(vid, f"the code fails on it: {type(exc).__name__}: {exc}", (),
                            frozenset(), 0, time.monotonic() - began)
    broken = tuple((v.name, v.detail, len(v.trace) - 1) for v in result.violations)
    return Searched(vid, "", broken, result.behaviour, result.states, time.monotonic() - began,
                    result.rests, frozenset(result.moves), frozenset(refusals))


def _recording(name: str, fn: Any, refusals: set[tuple[str, str]]) -> Any:
    """The condition `fn`, noting each (trigger, `name`) it refuses."""
    def condition(actor: Any, step: Any) -> Any:
        refusal = fn(actor, step)
        if refusal is not None:
            refusals.add((str(step.trigger), name))
        return refusal

    return condition


def _same_definition(text: str, shipped: Any) -> tuple[bool, str]:
    """(whether `text` loads to the shipped `Definition`, why it is refused at load or "")."""
    from agent_fsm.upgrade import registry

    try:
        loaded = registry.load_definition(text, shipped.source)
    except AgentFsmError as exc:
        return False, f"refused at load: {exc}"
    return loaded == shipped, ""


def _differs(mine: frozenset[Any], shipped: frozenset[Any]) -> str:
    def one(items: set[Any]) -> str:
        if not items:
            return "none"
        seen, units = min(items, key=repr)
        return f"e.g. {seen.summary()}; units {units}"

    more, fewer = set(mine - shipped), set(shipped - mine)
    settled = sum(1 for seen, _ in more | fewer if seen.pending is None)
    return (f"no rule broken, other reachable behaviour: {len(more)} configuration(s) the "
            f"shipped definition never shows ({one(more)}), {len(fewer)} it shows that this "
            f"never does ({one(fewer)}); {settled} of these with nothing owed"
            + ("" if settled else " (they differ only while a transition is owed)"))


def exercised(found: Searched, trigger: str, source: str | None) -> bool:
    """Whether the transition a variant changes ever fired in its search (from the source it
    adds, for an added source): if not, its equivalence says nothing about the change."""
    return any(t == trigger and (source is None or s == source) for t, s in found.moves)


def classify(found: Searched, shipped: frozenset[Any], trigger: str | None = None,
             source: str | None = None, dropped: str | None = None,
             refused: frozenset[tuple[str, str]] = frozenset(),
             rests: frozenset[tuple[Any, Any]] | None = None) -> tuple[str, str]:
    """(outcome, why) of a variant changing `trigger`'s transition (adding `source`, or
    dropping the condition `dropped`, if given), from its search and the shipped definition's
    reachable behaviour (`refused`: the (trigger, condition) pairs that refused there; `rests`:
    where each of its configurations rests, which an equivalent's must match wherever both
    reach a configuration; None: not compared)."""
    if found.refused:
        return "caught", found.refused
    if found.broken:
        name, detail, steps = found.broken[0]
        return "caught", f"{name} ({steps} steps): {detail}"
    elsewhere = "" if rests is None else rests_differ(found.rests, rests)
    if elsewhere:
        return "survived", elsewhere
    if observable(found.behaviour) == observable(shipped):
        why = f"the same reachable behaviour ({found.states} configurations)"
        if found.behaviour != shipped:
            why += (" but for systemd's start count of an agent unit with no start limit, "
                    "which nothing shows and nothing acts on")
        if trigger is not None and dropped is not None and (trigger, dropped) not in refused:
            why += (f"; {UNEXERCISED}: {dropped} never refuses {trigger} in the shipped "
                    "definition's search")
        elif trigger is not None and not exercised(found, trigger, source):
            why += (f"; {UNEXERCISED}: {trigger} never fires"
                    + (f" from {source}" if source else "") + " within the bound")
        return "equivalent", why
    if at_rest(found.behaviour) == at_rest(shipped):
        return AT_REST, (f"the same configurations at rest ({len(at_rest(shipped))}), every rule "
                         "kept on the way: " + _differs(observable(found.behaviour),
                                                        observable(shipped)))
    return "survived", _differs(found.behaviour, shipped)


def rests_differ(mine: frozenset[tuple[Any, Any]], shipped: frozenset[tuple[Any, Any]]) -> str:
    """Where a configuration both searches reach rests differently once the faults stop (what
    it shows, and at rest what the one it rests in shows), in words; "" when none does. The sets
    of configurations may agree while a path ends elsewhere: this compares each path's end."""
    def table(rests: frozenset[tuple[Any, Any]]) -> dict[Any, set[Any]]:
        out: dict[Any, set[Any]] = {}
        for shown, rest in rests:
            out.setdefault(_observable(shown), set()).add(_at_rest(rest))
        return out

    a, b = table(mine), table(shipped)
    for shown in sorted(a.keys() & b.keys(), key=repr):
        if a[shown] != b[shown]:
            seen, there = shown[0], min(a[shown] - b[shown] or a[shown], key=repr)[0]
            return (f"no rule broken, but from a configuration the shipped definition reaches too "
                    f"({seen.summary()}) the node rests elsewhere once the faults stop: "
                    f"{there.summary()}, last result {there.last_result}")
    return ""


def _observable(item: tuple[Any, Any]) -> tuple[Any, Any]:
    seen, units = item
    return seen, (units if units[KEY_LIMIT] is not None else
                  (*units[:KEY_STARTS], None, *units[KEY_STARTS + 1:]))


def _at_rest(item: tuple[Any, Any]) -> tuple[Any, Any]:
    seen, units = item
    return seen, tuple(u for i, u in enumerate(units) if i not in (KEY_STARTS, KEY_AGENT_RESTARTS))


def observable(behaviour: frozenset[Any]) -> frozenset[Any]:
    """What each configuration shows, systemd's start count left out where the agent unit
    loaded has no start limit: no property shows the count, and without a limit it refuses
    nothing (where a later unit's limit meets it, the configurations there differ)."""
    return frozenset(_observable(item) for item in behaviour)


def at_rest(behaviour: frozenset[Any]) -> frozenset[Any]:
    """The configurations the node rests in (the liveness goal: converged, nothing owed, no
    signal, the gate open, the last-good's agent running on its assets, no recovery running),
    systemd's start count and the agent unit's `NRestarts` left out: at rest the start limit's
    interval passes and systemd forgets the starts, and the serving daemon resets `NRestarts`
    `stable_after` seconds after a start that followed crashes (`Workload.forget_crashes`)."""
    return frozenset(_at_rest((seen, units)) for seen, units in behaviour
                     if seen.state == "converged" and seen.pending is None and seen.signal is None
                     and seen.gate and seen.selected == seen.last_good
                     and seen.assets == seen.selected and units[1] == f"active:{seen.selected}"
                     and units[2] == "inactive")


def _dropped_condition(v: Any) -> str | None:
    if v.operator != "drop-condition":
        return None
    return str(v.id.split("drop condition ", 1)[1].split(" (#")[0])


def _added_source(v: Any) -> str | None:
    if v.operator != "add-source":
        return None
    return str(v.id.split("add source ", 1)[1].split(" (#")[0])


def run(only: Callable[[str], bool] = lambda _id: True, *, jobs: int = 2,
        bound: Bound | None = None) -> Iterator[Verdict]:
    """Check the shipped definition and each variant `only` selects, `jobs` at a time; yield a
    verdict per variant as it is known (not in order). Raises ShippedBroken when the shipped
    definition itself breaks a rule."""
    bound = bound or BOUNDS["mutant"]
    from agent_fsm.upgrade import registry

    shipped_definition = registry.load_definition()
    todo: list[Any] = []
    for v in variants():
        if not only(v.id):
            continue
        began = time.monotonic()
        same, refused = _same_definition(v.text, shipped_definition)
        if refused:
            yield Verdict(v.id, "caught", refused, time.monotonic() - began)
        elif same:
            yield Verdict(v.id, "equivalent", "loads to the shipped Definition",
                          time.monotonic() - began)
        else:
            todo.append(v)
    if not todo:
        return
    context = multiprocessing.get_context("spawn")  # each worker afresh: nothing of this process
    # Leaving the block (done, an error, or SystemExit from a signal) terminates the workers;
    # each then ends as by `sys.exit`, so its temporary directory goes too.
    with context.Pool(max(1, jobs), initializer=_exit_on_sigterm) as pool:
        first = pool.apply_async(search, (SHIPPED, None, bound, False))
        by_id = {v.id: v for v in todo}
        found_all = pool.imap_unordered(_search_variant, [(v.id, v.text, bound) for v in todo])
        base = first.get()
        if base.refused or base.broken:
            raise ShippedBroken(f"the shipped definition fails the model check at {bound}: "
                                f"{base.refused or base.broken[0][:2]}; fix it (or the check) "
                                "before judging its variants")
        for found in found_all:
            v = by_id[found.id]
            outcome, why = classify(found, base.behaviour, v.trigger, _added_source(v),
                                    _dropped_condition(v), base.refusals, base.rests)
            yield Verdict(found.id, outcome, why, found.seconds)


def _search_variant(job: tuple[str, str, Bound]) -> Searched:
    vid, text, bound = job
    return search(vid, text, bound, True)


def _exit_on_sigterm() -> None:
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
