"""`<run_dir>/judgment.json`: the daemon's judgment of a candidate so far, for `upgrade --wait`. It
holds each check's last answer and, once they passed, when the soak ends.

The daemon writes it atomically after each round of checks and when the soak begins. A reader trusts
it only for the version and attempt the signal names (systemd removes the run dir whenever the agent
unit stops). Reading never fails: a missing or garbled one is None.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from ... import files
from ...errors import AgentFsmError
from ..check_config import Check, HttpCheck
from ..paths import Paths

log = logging.getLogger("agent_fsm")

MAX_BYTES = 64 << 10


class Answer(NamedTuple):
    check: str  # its command's first word, or its URL
    ok: bool
    said: str  # agent-fsm's words, the check's own quoted


class Record(NamedTuple):
    version: str
    attempt: int
    answers: tuple[Answer, ...]
    soak_ends: float | None  # the wall clock's time the soak ends; None before it began

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "attempt": self.attempt,
                "answers": [a._asdict() for a in self.answers], "soak_ends": self.soak_ends}


def path(paths: Paths) -> Path:
    return paths.real(paths.config.run_dir) / "judgment.json"


def write(paths: Paths, record: Record) -> None:
    """Record where the judgment is; DiskError if the run dir cannot take it."""
    files.atomic_write(path(paths), json.dumps(record.to_json()).encode() + b"\n", 0o644)


def read(paths: Paths) -> Record | None:
    """The record; None when it is missing or not one."""
    try:
        data = json.loads(files.read_regular(path(paths), MAX_BYTES))
        soak = data["soak_ends"]
        return Record(str(data["version"]), int(data["attempt"]),
                      tuple(Answer(str(a["check"]), a["ok"] is True, str(a["said"]))
                            for a in data["answers"]),
                      None if soak is None else float(soak))
    except (OSError, ValueError, KeyError, TypeError, AgentFsmError):
        return None


def name(check: Check) -> str:
    return check.url if isinstance(check, HttpCheck) else Path(check[0]).name


def teller(paths: Paths, version: str, attempt: int
           ) -> Callable[[Sequence[tuple[Check, bool, str]], float | None], None]:
    """What the judgment tells (each round's answers; the soak's seconds when it begins),
    recorded for the candidate `version`'s `attempt`. A run dir that cannot take it is logged
    and the judgment goes on: only `upgrade --wait` reads it."""
    last: list[Answer] = []

    def told(answers: Sequence[tuple[Check, bool, str]], soak: float | None) -> None:
        if answers:
            last[:] = [Answer(name(c), ok, said) for c, ok, said in answers]
        ends = None if soak is None else time.time() + soak
        try:
            write(paths, Record(version, attempt, tuple(last), ends))
        except AgentFsmError as exc:
            log.info("could not record the judgment's progress in %s: %s", path(paths), exc)
    return told
