"""The state file's document in memory: the state, the upgrade, the pending transition, history.

Plain classes, not dataclasses: `status` imports this module, and a dataclass compiles its
methods at import (docs/design.md). `StateDoc` and `Pending` are mutable; the engine assigns
their fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple


class Upgrade(NamedTuple):
    from_version: str
    to_version: str
    started: float
    extra: Mapping[str, Any] = MappingProxyType({})  # keys a later agent-fsm wrote, kept
    # The channel an upgrade begun by `follow` came from: {name, index_version}; None otherwise.
    channel: Mapping[str, Any] | None = None


class _Fields:
    """Equality and repr by the fields in `__slots__`; defining `__eq__` leaves the class unhashable."""

    __slots__: tuple[str, ...] = ()  # in a subclass, its fields in order: == and repr follow it

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return tuple(getattr(self, n) for n in self.__slots__) == \
               tuple(getattr(other, n) for n in self.__slots__)

    def __repr__(self) -> str:
        shown = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)
        return f"{type(self).__name__}({shown})"


class Pending(_Fields):
    """A transition recorded before its effects run; `done` of them have completed."""

    __slots__ = ("trigger", "source", "dest", "effects", "done", "args", "started",  # noqa: RUF023
                 "extra")

    def __init__(self, trigger: str, source: str, dest: str, effects: list[str], done: int,
                 args: dict[str, Any], started: float,
                 extra: dict[str, Any] | None = None) -> None:
        self.trigger = trigger
        self.source = source
        self.dest = dest
        self.effects = effects
        self.done = done
        self.args = args
        self.started = started
        self.extra: dict[str, Any] = {} if extra is None else extra  # a later agent-fsm's keys


class StateDoc(_Fields):
    """The state file's contents; a missing file is `StateDoc(state=<initial>)`."""

    __slots__ = ("state", "upgrade", "pending", "last_result", "counters", "seq",  # noqa: RUF023
                 "since", "last_transition", "skipped", "crash_loop", "extra")

    def __init__(self, state: str, upgrade: Upgrade | None = None,
                 pending: Pending | None = None, last_result: dict[str, Any] | None = None,
                 counters: dict[str, int] | None = None, seq: int = 0,
                 since: float | None = None, last_transition: float | None = None,
                 skipped: list[dict[str, Any]] | None = None,
                 crash_loop: dict[str, Any] | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        self.state = state
        self.upgrade = upgrade
        self.pending = pending
        self.last_result = last_result
        self.counters = counters  # None: a store without count rules
        self.seq = seq  # the number of the last transition committed to the journal
        self.since = since  # when the stay in the current state began
        self.last_transition = last_transition  # when the last transition finished
        # The effects let fail in this cycle.
        self.skipped: list[dict[str, Any]] = [] if skipped is None else skipped
        # The crash loop the last entry stands for (`store.record`): {seq, trigger, restarts,
        # first, last}; None when the last entry is no start after a crash.
        self.crash_loop = crash_loop
        # Keys a later agent-fsm wrote that this one does not know: kept as they are on every
        # rewrite (`store`), never dropped (docs/state-files.md, the compatible core).
        self.extra: dict[str, Any] = {} if extra is None else extra
