"""Hooks as the machine sees them: which transitions may have a `before` hook, and how it is run.

Only an operator-started transition runs a `before` hook, which may refuse it (`install`,
`activate`, `begin_upgrade`). What the daemon or recovery fires runs none, so hooks never block
a rollback. `after` hooks may follow any transition once recorded; a failure is only logged.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Collection, Iterator, Mapping
from typing import Any, Protocol

from ..errors import ConfigError, Refused
from ..node.hook_config import HookConfig
from .definition import Definition, Role
from .vocabulary import RESULT_EFFECTS, groups


class Hooks(Protocol):
    """What the engine is given to run hooks; the transition travels as a JSON-able mapping."""

    def has_before(self, trigger: str) -> bool: ...

    def before(self, transition: Mapping[str, Any]) -> str | None:
        """Run the trigger's `before` hook: None to go on, else why not (with the hook's last line)."""
        ...

    def after(self, transition: Mapping[str, Any]) -> None:
        """Run the trigger's `after` hook, if any, without delaying the caller; a failure is logged."""
        ...


class NoHooks:
    """No hooks configured: every transition goes on, nothing is run."""

    def has_before(self, trigger: str) -> bool:
        return False

    def before(self, transition: Mapping[str, Any]) -> str | None:
        return None

    def after(self, transition: Mapping[str, Any]) -> None:
        return None


@functools.lru_cache(maxsize=8)  # once per definition, as its groups
def before_triggers(d: Definition) -> frozenset[str]:
    """The triggers that may run a `before` hook: an operator's, closing the gate, not rolling back."""
    g = groups(d)
    return frozenset(t.trigger for t in d.transitions
                     if t.trigger in g.cycle_starts and t.dest not in g.rolling_back
                     and Role.operator in t.by)


def check(hooks: HookConfig, d: Definition, source: object) -> None:
    """Refuse hooks for unknown triggers, and `before` hooks for transitions the operator does not start."""
    known = [t.trigger for t in d.transitions]
    allowed = before_triggers(d)
    for when, table in (("before", hooks.before), ("after", hooks.after)):
        for trigger in table:
            if trigger not in known:
                raise ConfigError(
                    f"config {source}: `hooks.{when}.{trigger}` names no trigger of "
                    f"{d.name}; known triggers: {', '.join(known)}")
            if when == "before" and trigger not in allowed:
                raise ConfigError(
                    f"config {source}: `hooks.before.{trigger}` is not allowed: {trigger} is "
                    "not started by an operator, and a hook may never block or delay the daemon "
                    f"or the way back; `before` hooks may run for: {', '.join(sorted(allowed))} "
                    f"(use `hooks.after.{trigger}` to be told of it)")


def transition(when: str, trigger: str, source: str, dest: str, from_version: str | None,
               to_version: str | None, time: float, **extra: Any) -> dict[str, Any]:
    """The transition as a hook receives it: JSON on stdin, and `AGENT_FSM_<KEY>` for each scalar."""
    return {"hook": when, "trigger": trigger, "source": source, "dest": dest,
            "from": from_version, "to": to_version, "time": time, **extra}


def finished(entry: Mapping[str, Any], args: Mapping[str, Any], effects: Collection[str],
             last_result: Mapping[str, Any] | None) -> dict[str, Any]:
    """The transition an `after` hook is told of, from its history entry.

    `outcome` is "ok" or "degraded"; `result` is the upgrade's, when this transition reported
    one.
    """
    up = entry.get("upgrade")
    reported = last_result is not None and bool(set(RESULT_EFFECTS) & set(effects))
    return transition(
        "after", entry["trigger"], entry["from"], entry["to"],
        up["from"] if up else args.get("from"), up["to"] if up else entry.get("release"),
        float(entry["time"]), outcome="degraded" if entry.get("skipped") else "ok",
        skipped=list(entry.get("skipped") or ()),
        result=last_result.get("outcome") if reported and last_result is not None else None)


def ask(hooks: Hooks, trigger: str, source: str, dest: str, args: Mapping[str, Any]) -> None:
    """Run an operator-started transition's `before` hook; a refusal is raised (exit 3) before any write."""
    why = hooks.before(transition("before", trigger, source, dest, args.get("from"),
                                  args.get("release"), float(args["started"])))
    if why is not None:
        raise Refused(f"{trigger} refused by its before hook: {why}")


@contextlib.contextmanager
def telling(hooks: Hooks, done: list[dict[str, Any]]) -> Iterator[None]:
    """Run the `after` hooks of the transitions recorded in the block once it and its lock are left."""
    try:
        yield
    finally:
        told = list(done)
        done.clear()
        for moment in told:
            hooks.after(moment)
