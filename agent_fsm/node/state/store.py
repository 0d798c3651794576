"""The state file: the machine's state, the pending upgrade, the effects still owed, counters.

`<state_dir>/state.json` is a `state` document (docs/state-files.md). Writers hold the flock on
`state.lock` for a whole transition; readers need none, as every write is atomic. A damaged or
newer file, or one with a field the machine does not write, is refused in one line naming the
field and its value, and never overwritten.

`record` appends and fsyncs a transition's entry to `history.jsonl` (`journal`), then commits it
by writing the state file with its `seq`. The state file also holds what `status` shows of the
history, so `status` never reads the journal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from ... import files
from ...errors import LockTimeout, Refused
from . import entries, lock, validate
from .counters import Counters, CountRules, to_json
from .document import Pending as Pending  # the document's classes, imported from here too
from .document import StateDoc as StateDoc
from .document import Upgrade as Upgrade
from .document_file import Kind
from .document_file import checksum as checksum  # of a body: tests rewrite files with it
from .journal import FILE_NAME, Journal, Read, advanced_skipped

SCHEMA = 2
FILE_MODE = 0o644
MAX_BYTES = 256 << 20  # as good as none (it had none): what it keeps is not bounded in bytes
ANY_NAMES = entries.Names()  # what a reader not given the machine's names accepts: any
# Starts after crashes at most this far apart (seconds, by their entries' times) are one crash
# loop: well above systemd's longest restart delay here (`render.RESTART_MAX_DELAY`).
CRASH_LOOP_WINDOW = 600.0
# How often the serving daemon looks for an operator's transition left owed by a command that
# died (agent/dead_command.py's `DeadCommand`); `status` names it too.
OWED_CHECK_SECONDS = 5.0


def check_body(body: dict[str, Any], schema: int, names: entries.Names = ANY_NAMES) -> None:
    """Every field of a state file's body; the machine's `names` when the reader has them."""
    validate.state_body(body, names.states, names.triggers, names.effects)
    entries.journal_fields(body, names)


KIND = Kind("state", "state file", "the state", SCHEMA, check_body, MAX_BYTES, FILE_MODE)


# The keys of the body, of its `upgrade` and of its `pending` that this agent-fsm writes: any
# other is a later agent-fsm's, kept as it is (`StateDoc.extra`).
KNOWN_KEYS = frozenset({"state", "upgrade", "pending", "last_result", "counters", "seq", "since",
                        "last_transition", "skipped", "crash_loop"})
UPGRADE_KEYS = frozenset({"from", "to", "started", "channel"})
PENDING_KEYS = frozenset({"trigger", "source", "dest", "effects", "done", "args", "started"})


def _others(data: dict[str, Any], known: frozenset[str]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k not in known}


def _body(doc: StateDoc) -> dict[str, Any]:
    up = doc.upgrade
    pend = doc.pending
    return {
        **doc.extra,  # a later agent-fsm's keys first: what this one writes wins
        "state": doc.state,
        "upgrade": None if up is None else {
            **up.extra, "from": up.from_version, "to": up.to_version, "started": up.started,
            **({} if up.channel is None else {"channel": dict(up.channel)}),
        },
        "pending": None if pend is None else {
            **pend.extra, "trigger": pend.trigger, "source": pend.source, "dest": pend.dest,
            "effects": pend.effects, "done": pend.done, "args": pend.args,
            "started": pend.started,
        },
        "last_result": doc.last_result,
        "seq": doc.seq,
        "since": doc.since,
        "last_transition": doc.last_transition,
        "skipped": doc.skipped,
        **({} if doc.counters is None else {"counters": doc.counters}),
        **({"crash_loop": doc.crash_loop} if doc.crash_loop else {}),  # absent when none
    }


def encode(doc: StateDoc) -> bytes:
    return KIND.encode(_body(doc))


class Store:
    def __init__(self, path: Path, lock_path: Path, states: Collection[str], initial: str,
                 *, triggers: Collection[str] | None = None,
                 effects: Collection[str] | None = None, count_rules: CountRules | None = None,
                 lock_timeout: float = 30.0, journal_path: Path | None = None) -> None:
        """`states`, `triggers` and `effects` are the names a file may use (the last two: any, if None)."""
        self.path = path
        self.count_rules = count_rules
        self.lock_path = lock_path
        self.states = frozenset(states)
        self.triggers = None if triggers is None else frozenset(triggers)
        self.effects = None if effects is None else frozenset(effects)
        self.names = entries.Names(self.states, self.triggers, self.effects)
        self._check = partial(check_body, names=self.names)
        self.initial = initial
        self.lock_timeout = lock_timeout
        # Whether a stop was asked for: a wait for the lock then ends (StopRequested). The
        # daemon sets it to its SIGTERM flag; None: a wait ends only at `lock_timeout`.
        self.stopping: Callable[[], bool] | None = None
        self._cycle_starts = frozenset() if count_rules is None else count_rules.cycle_starts
        versions: set[str] = set()  # found good, shared by the lines of a read
        self.journal = Journal(journal_path or path.with_name(FILE_NAME),
                               lambda e, at: entries.history_entry(e, at, self.names, versions))

    def read(self) -> StateDoc:
        """The current state; a missing file is the initial state. Needs no lock."""
        data = KIND.read(self.path, self._check)
        if data is None:
            return StateDoc(state=self.initial)
        return self._upgraded(self._from_body(data))

    def decode(self, raw: bytes) -> StateDoc:
        """The document in `raw`; StateFileError when damaged, newer, or a field is not valid."""
        return self._upgraded(self._from_body(KIND.decode(raw, self.path, self._check)))

    def _upgraded(self, doc: StateDoc) -> StateDoc:
        """`doc` with counters, which a store without count rules did not write."""
        if doc.counters is None and self.count_rules is not None:
            doc.counters = to_json(Counters())
        return doc

    @staticmethod
    def _from_body(data: dict[str, Any]) -> StateDoc:
        """The document of a body `validate.state_body` accepted."""
        up = data["upgrade"]
        pend = data["pending"]
        doc = StateDoc(
            state=data["state"],
            upgrade=None if up is None else Upgrade(up["from"], up["to"], float(up["started"]),
                                                    _others(up, UPGRADE_KEYS), up.get("channel")),
            pending=None if pend is None else Pending(
                trigger=pend["trigger"], source=pend["source"], dest=pend["dest"],
                effects=list(pend["effects"]), done=pend["done"], args=pend["args"],
                started=float(pend["started"]), extra=_others(pend, PENDING_KEYS),
            ),
            last_result=data["last_result"],
            counters=None if data.get("counters") is None else dict(data["counters"]),
            extra=_others(data, KNOWN_KEYS),
        )
        doc.seq, doc.since = data["seq"], data["since"]
        doc.last_transition, doc.skipped = data["last_transition"], list(data["skipped"])
        doc.crash_loop = data.get("crash_loop")
        return doc

    def write(self, doc: StateDoc) -> None:
        """Replace the state file atomically and durably; the caller holds the lock.

        On DiskError the transition stops there and the next start resumes it.
        """
        KIND.write(self.path, _body(doc))

    def record(self, doc: StateDoc, entry: dict[str, Any], limit: int) -> None:
        """Commit a finished transition: append and fsync its entry, then write the state file.

        After a crash between the two, readers drop the entry and the resumed transition
        replaces it. A restart within CRASH_LOOP_WINDOW of one with the same trigger replaces
        that entry instead (`repeat`), so a crash loop is one entry. The caller holds the lock.
        """
        loop = doc.crash_loop
        if entry.get("restarts"):
            if loop is not None and loop["seq"] == doc.seq and loop["trigger"] == entry["trigger"] \
                    and entry["time"] - loop["last"] < CRASH_LOOP_WINDOW:
                self.repeat(doc, entry, limit)
                return
            entry = {**entry, "restarts": 1, "first": entry["time"]}
            doc.crash_loop = {"seq": doc.seq + 1, "trigger": entry["trigger"], "restarts": 1,
                              "first": entry["time"], "last": entry["time"]}
        else:
            doc.crash_loop = None
        seq = doc.seq + 1
        try:
            self.journal.append({**entry, "seq": seq}, limit)
        except OSError as exc:  # the journal's own append; the next start resumes the transition
            raise files.disk_error(exc, f"append to the history journal {self.journal.path}",
                                   self.journal.path.parent) from exc
        doc.seq = seq
        if doc.since is None or entry["from"] != entry["to"]:
            doc.since = float(entry["time"])
        doc.last_transition = float(entry["time"])
        doc.skipped = advanced_skipped(doc.skipped, entry, self._cycle_starts)[-limit:]
        self.write(doc)

    def repeat(self, doc: StateDoc, entry: dict[str, Any], limit: int) -> None:
        """Commit a restart as one more of the crash loop the last entry stands for.

        The count comes from the state file, so a crash between the two writes counts it once.
        """
        loop = doc.crash_loop
        assert loop is not None
        loop = {**loop, "restarts": loop["restarts"] + 1, "last": entry["time"]}
        merged = {**entry, "seq": doc.seq, "restarts": loop["restarts"], "first": loop["first"]}
        try:
            self.journal.replace_last(merged, limit)
        except OSError as exc:
            raise files.disk_error(exc, f"rewrite the history journal {self.journal.path}",
                                   self.journal.path.parent) from exc
        doc.crash_loop = loop
        doc.last_transition = float(entry["time"])
        doc.skipped = advanced_skipped(doc.skipped, entry, self._cycle_starts)[-limit:]
        self.write(doc)

    def history(self, doc: StateDoc | None = None) -> list[dict[str, Any]]:
        """The committed transitions as of `doc` (read now if not given), oldest first. No lock."""
        return self.read_journal(doc).entries

    def read_journal(self, doc: StateDoc | None = None) -> Read:
        """The journal as of `doc`, with the damaged lines it skipped (for `doctor`)."""
        doc = self.read() if doc is None else doc
        return self.journal.read(doc.seq)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the writers' lock for a whole transition."""
        # The state dir 0700 and the lock 0600: a user who could open the lock could hold it
        # (`flock -s`) and make every transition time out.
        files.ensure_private_dir(self.lock_path.parent)
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(lock.held(self.lock_path, self.lock_timeout,
                                              stopping=self.stopping))
            except LockTimeout:
                raise Refused(
                    f"another agent-fsm operation has held {self.lock_path} for over "
                    f"{self.lock_timeout:g}s; try again when it finishes"
                ) from None
            yield

    @contextlib.contextmanager
    def locked_if_free(self) -> Iterator[bool]:
        """Hold the writers' lock for the block if it is free now; no wait.

        Yields True holding it, False holding nothing. A transition found owed while this holds
        it was left by a process that stopped.
        """
        files.ensure_private_dir(self.lock_path.parent)
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(lock.held(self.lock_path, 0.0))
                got = True
            except LockTimeout:
                got = False
            yield got
