"""Which role a process plays (`by` in states/agent-upgrade.toml): its command and its release.

The daemon's role is fixed at start by the release whose `lib/` it imported (`running`); from a
checkout or wheel, the release selected then. The last-good's release is `last_good`, the
candidate's `candidate`, any other none. `agent-fsm recover` is `recovery` unless run from the
candidate's release. Every other command is `operator`.
"""

from __future__ import annotations

import enum

from ..errors import SignalError
from ..machine.definition import Role
from ..machine.vocabulary import StateName, Trigger
from ..node.state.store import StateDoc
from .effectors import Effectors


class Command(enum.StrEnum):
    """The command a process runs, as far as its role goes."""

    daemon = "daemon"
    recover = Trigger.recover.value  # the command is named for the trigger it fires
    operator = "operator"  # any other command that writes


class Process:
    """This process, as the engine asks it (`machine.engine.Process`)."""

    def __init__(self, command: Command, release: str | None, effectors: Effectors) -> None:
        self.command = command
        self.release = release  # the release whose code runs here; None: not known
        self.effectors = effectors

    @classmethod
    def started(cls, command: Command, effectors: Effectors) -> Process:
        """The process now starting, its release resolved once before anything changes it."""
        releases = effectors.releases
        release = releases.running()
        if release is None and command == Command.daemon:
            release = releases.selected()  # what the unit's ExecStart runs
        return cls(command, release, effectors)

    def _candidate(self, doc: StateDoc) -> str | None:
        if doc.upgrade is not None:
            return doc.upgrade.to_version
        # An owed transition that already cleared the signal (`complete`, killed after
        # clear_signal) still names its upgrade: its candidate is the one to finish it.
        owed = doc.pending.args.get("upgrade") if doc.pending is not None else None
        if isinstance(owed, dict) and owed.get("to"):
            return str(owed["to"])
        try:
            sig = self.effectors.signal()
        except SignalError:  # the way back must not need it
            return None
        return None if sig is None else sig.to_version

    def role(self, doc: StateDoc) -> Role | None:
        if self.command == Command.operator:
            return Role.operator
        if self.release is None:  # `recover` run from elsewhere: not a release's code here
            return Role.recovery if self.command == Command.recover else None
        if self.release == self.effectors.releases.last_good():
            if self.command == Command.daemon and self._owed_by_candidate(doc):
                return Role.candidate  # `complete` killed after it promoted this release
            return Role.last_good if self.command == Command.daemon else Role.recovery
        if self.release == self._candidate(doc):
            return Role.candidate
        return None

    def _owed_by_candidate(self, doc: StateDoc) -> bool:
        """Whether the owed transition is this release's own upgrade, from `judged_ok`."""
        owed = doc.pending
        up = owed.args.get("upgrade") if owed is not None else None
        return owed is not None and owed.source == StateName.judged_ok \
            and isinstance(up, dict) and up.get("to") == self.release

    def own_start(self) -> bool:
        return (self.command == Command.daemon and self.release is not None
                and self.release == self.effectors.releases.selected())

    def __str__(self) -> str:
        what = {Command.daemon: "the daemon", Command.recover: "`agent-fsm recover`",
                Command.operator: "this command"}[self.command]
        return what + (f" of release {self.release}" if self.release else "")
