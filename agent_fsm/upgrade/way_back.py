"""The way back's prologue, written once; then the caller does what the state declares.

The prologue abandons an upgrade cut before its candidate started, resumes what is owed, and
rolls back an orphan (`is_orphan`). Callers: the daemon's start (`START`), the serving last-good
(`IN_PLACE`) and `agent-fsm recover` (`RECOVER`); `status` asks the predicate alone.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, NamedTuple, Protocol

from ..errors import IllegalTransition, NotItsRole
from ..machine.vocabulary import Groups, Trigger
from ..node.state import reasons

if TYPE_CHECKING:
    from ..machine.engine import Controller
    from ..node.releases.pointers import Releases
    from ..node.runtime.signal import UpgradeSignal
    from ..node.state.store import StateDoc, Store


class Sees(Protocol):
    """What the predicate reads: the definition's groups and the signal."""

    @property
    def groups(self) -> Groups: ...

    def signal(self) -> UpgradeSignal | None: ...


class Goes(Sees, Protocol):
    """What the prologue is given: a writer's node (`wiring.Node`)."""

    @property
    def controller(self) -> Controller: ...

    @property
    def releases(self) -> Releases: ...

    @property
    def store(self) -> Store: ...


def is_orphan(groups: Groups, state: str, sig: UpgradeSignal | None) -> bool:
    """Whether `sig` exists while the state file knows no upgrade; an orphan was never judged here."""
    return sig is not None and state in groups.orphan_from


def orphan(node: Sees, doc: StateDoc) -> UpgradeSignal | None:
    """The signal when it is an orphan, else None; read only where it may be one."""
    if doc.state not in node.groups.orphan_from:
        return None
    sig = node.signal()
    return sig if is_orphan(node.groups, doc.state, sig) else None


def on_the_way_back(node: Goes) -> bool:
    """Whether a daemon start here is on a signal's way back, where a wrong config falls back.

    That is when the candidate was given up, a transition towards that is owed, or an orphan
    waits.
    """
    doc = node.store.read()
    back = node.groups.rolling_back
    return doc.state in back or (doc.pending is not None and doc.pending.dest in back) \
        or orphan(node, doc) is not None


def abandon_cut_upgrade(node: Goes, doc: StateDoc, *, restart: bool) -> StateDoc | None:
    """Abandon an upgrade cut before its candidate started (`begin_upgrade` owed).

    `abandon_upgrade` supersedes it and selects the last-good, restarting the unit if `restart`.
    None when no such upgrade is owed, or it has gone on since the unlocked read.
    """
    pending = doc.pending
    last_good = node.releases.last_good()
    if pending is None or pending.trigger != Trigger.begin_upgrade or last_good is None \
            or not node.controller.supersedes(Trigger.abandon_upgrade, doc):
        return None
    try:
        return node.controller.fire(
            Trigger.abandon_upgrade, release=last_good,
            upgrade={"from": last_good, "to": str(pending.args.get("release"))},
            **({} if restart else {"no_start": True}))
    except IllegalTransition:  # the upgrade went on meanwhile (read unlocked): not cut
        return None


class Way(NamedTuple):  # not a dataclass, nor logging at import: `status` imports this module
    """Who runs the prologue, and so what its steps ask of systemd."""

    abandon_restarts: bool  # abandoning a cut upgrade restarts the agent unit
    orphan_restarts: bool  # rolling back an orphan restarts it
    replaces: Trigger | None  # the caller's trigger, which replaces what is owed it supersedes
    hands_over: bool  # what is owed is another role's: NotItsRole raised, else the state decides
    orphan_words: str | None  # logged before an orphan's rollback; None: the result says it


# The daemon's start: it is the agent unit's process, so abandoning restarts nothing.
START = Way(abandon_restarts=False, orphan_restarts=True, replaces=None, hands_over=True,
            orphan_words="rolling back to the last-good")
# The serving last-good: nothing restarts, its workload runs throughout.
IN_PLACE = Way(abandon_restarts=False, orphan_restarts=False, replaces=None, hands_over=True,
               orphan_words="rolling back to the last-good, its workload left running")
# `agent-fsm recover`: its rollback replaces what the candidate's path left owed.
RECOVER = Way(abandon_restarts=True, orphan_restarts=True, replaces=Trigger.recover,
              hands_over=False, orphan_words=None)


class Leftover(enum.StrEnum):
    """What the prologue cleared that ended it: a restart was asked, whose start does the rest."""

    cut_upgrade = "cut_upgrade"
    orphan = "orphan"


class Cleared(NamedTuple):
    """The state once the leftovers are cleared, and what ended the prologue, if anything."""

    doc: StateDoc
    ended_by: Leftover | None = None
    signal: UpgradeSignal | None = None  # the orphan's, when one was rolled back


def clear_leftovers(node: Goes, doc: StateDoc, way: Way, *, abandon: bool = True) -> Cleared:
    """Abandon a cut upgrade (when `abandon`), resume what is owed, roll back an orphan, as `way` says.

    A step that asks for a restart ends it (`Cleared.ended_by`).
    """
    import logging

    log = logging.getLogger("agent_fsm")
    if abandon and (abandoned := abandon_cut_upgrade(
            node, doc, restart=way.abandon_restarts)) is not None:
        if way.abandon_restarts:
            return Cleared(abandoned, Leftover.cut_upgrade)
        doc = abandoned
    if way.replaces is None or not node.controller.supersedes(way.replaces, doc):
        try:
            doc = node.controller.resume()
        except NotItsRole as exc:
            if way.hands_over:
                raise
            log.warning("%s", exc)  # the candidate's to finish (`complete`): go by the state
    if (sig := orphan(node, doc)) is None:
        return Cleared(doc)
    if way.orphan_words is not None:
        log.error("an upgrade signal exists but the state file (%s) knows no upgrade; %s",
                  doc.state, way.orphan_words)
    doc = node.controller.fire(Trigger.orphaned_signal,
                               **({} if way.orphan_restarts else {"no_start": True}),
                               **reasons.orphaned(doc.state))
    return Cleared(doc, Leftover.orphan if way.orphan_restarts else None, sig)
