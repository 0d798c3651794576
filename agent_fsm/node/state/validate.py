"""Field-by-field checks of what agent-fsm reads back from its own files, after the checksum.

Each checker takes a value and its field's name (`pending.done`) and returns the value or raises
`Invalid` naming the field, the value and what was expected. `state_body`, `signal_body` and
`result_body` are the rules of those files; other files' rules live beside their readers,
history entries' in `entries`. What old layouts lack (counters) is allowed: `Store._upgraded`
fills it in.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

from ...errors import Invalid
from ..releases.pointers import VERSION_RE
from .counters import Counters
from .document_file import Kind, Problem
from .reasons import CLASSES, MAX_REASON

MISSING: Any = object()  # a key the object lacks
COUNTERS = Counters._fields
OUTCOMES = ("ok", "rolled_back")  # as system.publish.Outcome (node does not import system)
MAX_TIME = 1e15  # seconds since the epoch: some thirty million years, and exact as a float
TIME = f"a time in seconds since the epoch, from 0 to {MAX_TIME:g}"
MAX_COUNT = 2**53  # beyond it a count no longer survives conversion to a float (metrics)
VERSION = "a release version (letters, digits, '.', '+', '_' and '-', at most 64)"


def invalid(field: str, value: Any, expected: str = "", *, problem: str = "") -> Invalid:
    """The error for one field: its name and value, and what was expected (or `problem` in full)."""
    return Invalid(field, problem or f"{field} is {shown(value)}, expected {expected}")


def shown(value: Any) -> str:
    """The value as a message shows it: on one line, and short."""
    if value is MISSING:
        return "missing"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# The checkers -----------------------------------------------------------------------------
def obj(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise invalid(field, value, "an object")
    return value


def array(value: Any, field: str) -> list[Any]:
    if not isinstance(value, list):
        raise invalid(field, value, "a list")
    return value


def time(value: Any, field: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) \
            and 0 <= value <= MAX_TIME:  # NaN compares false
        return float(value)
    raise invalid(field, value, TIME)


def count(value: Any, field: str, most: int | None = None, of: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 \
            or value > (MAX_COUNT if most is None else most):
        expected = "a non-negative integer" if most is None else \
            f"an integer from 0 to {most}{f' ({of})' if of else ''}"
        raise invalid(field, value, expected)
    return value


def flag(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise invalid(field, value, "true or false")
    return value


def version(value: Any, field: str, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if isinstance(value, str) and _is_version(value):
        return value
    raise invalid(field, value, VERSION + (" or null" if optional else ""))


# A name another agent-fsm's machine may use (a later one's effect, trigger or state): what the
# definition allows (`definition`'s names), checked where this reader does not know it.
NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,63}")


def name(value: Any, field: str, known: Collection[str] | None, kind: str, *,
         foreign: bool = False) -> str:
    """A name of the machine's; any string when the reader was not given the known ones.

    `foreign` lets an unknown name pass (a later agent-fsm's, never acted on here).
    """
    if not isinstance(value, str):
        raise invalid(field, value, f"the name of a {kind}")
    if foreign and known is not None and value not in known:
        if NAME_RE.fullmatch(value) is None:
            raise invalid(field, value, f"the name of a {kind} (lower-case letters, digits and "
                          "'_', at most 64)")
        return value
    if known is not None and value not in known:
        listed = ", ".join(sorted(known))
        raise invalid(field, value,
                      problem=f"{field} names unknown {kind} {value!r} (known: {listed})")
    return value


def one_of(value: Any, field: str, choices: Collection[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise invalid(field, value, " or ".join(repr(str(c)) for c in choices))
    return value


def nullable(data: Mapping[str, Any], key: str) -> Any:
    """The value of a key that may be null but not absent."""
    value = data.get(key, MISSING)
    if value is MISSING:
        raise invalid(key, value, "an object or null")
    return value


def pair(value: Any, field: str) -> None:
    """An upgrade's versions, {from, to}, or null."""
    if value is not None:
        pair = obj(value, field)
        version(pair.get("from", MISSING), f"{field}.from")
        version(pair.get("to", MISSING), f"{field}.to")


CHANNEL_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}")  # as `[channel] name`


def channel_ref(value: Any, field: str) -> None:
    """The channel an upgrade begun by `follow` came from: {name, index_version}."""
    c = obj(value, field)
    name_ = c.get("name", MISSING)
    if not isinstance(name_, str) or CHANNEL_NAME_RE.fullmatch(name_) is None:
        raise invalid(f"{field}.name", name_, "a channel name (letters, digits, '.', '_', '@', "
                      "'+', '-', at most 128)")
    count(c.get("index_version", MISSING), f"{field}.index_version")


# The files --------------------------------------------------------------------------------
def result_body(data: Any, where: str = "") -> None:
    """A published result (the state file's `last_result`, an outbox entry)."""
    r = obj(data, where or "the result")
    at = f"{where}." if where else ""
    version(r.get("from", MISSING), f"{at}from")
    version(r.get("to", MISSING), f"{at}to")
    one_of(r.get("outcome", MISSING), f"{at}outcome", OUTCOMES)
    time(r.get("started", MISSING), f"{at}started")
    time(r.get("time", MISSING), f"{at}time")
    if "reason" in r and (not isinstance(r["reason"], str) or len(r["reason"]) > MAX_REASON):
        raise invalid(f"{at}reason", r["reason"], f"a string of at most {MAX_REASON} characters")
    if "reason_class" in r:  # both absent in a result recorded before reasons were kept
        one_of(r["reason_class"], f"{at}reason_class", CLASSES)
    if "publisher_unreachable_since" in r:  # a result queued by complete_queued
        time(r["publisher_unreachable_since"], f"{at}publisher_unreachable_since")
    if "channel" in r:  # an upgrade begun by `follow`
        channel_ref(r["channel"], f"{at}channel")


# `results/<started>-<to>.json` and its copy queued in `outbox/` (schema 0: no schema). Their
# writer, `system.publish`, is given this kind by the wiring (it does not import the node's).
RESULT = Kind("result", "queued result", "the result", 1, lambda body, _: result_body(body),
              64 << 10, 0o644)


def result_file(raw: bytes) -> None:
    """A queued result's bytes, checked as delivery checks them; ValueError if not a valid result."""
    try:
        RESULT.body(raw)
    except Problem as problem:
        raise ValueError(problem.why.removeprefix("is ")) from None


def signal_body(data: Any) -> None:
    s = obj(data, "the signal")
    version(s.get("from", MISSING), "from")
    version(s.get("to", MISSING), "to")
    count(s.get("attempt", MISSING), "attempt")
    time(s.get("started", MISSING), "started")
    time(s.get("deadline", MISSING), "deadline")
    for key in ("starts", "timeouts", "unit_restarts"):
        if key in s:
            count(s[key], key)
    if "timed_out_by" in s:
        time(s["timed_out_by"], "timed_out_by")


# The values `Effectors.prepare` and the engine fix in a transition's arguments; others are kept as
# they are (JSON, read by no one here).
def _args(value: Any, field: str) -> None:
    args = obj(value, field)
    for key, check in (("release", version), ("from", version)):
        if key in args:
            check(args[key], f"{field}.{key}", optional=True)
    if "started" in args:
        time(args["started"], f"{field}.started")
    if "attempt" in args:
        count(args["attempt"], f"{field}.attempt")
    if "no_start" in args:
        flag(args["no_start"], f"{field}.no_start")
    if "upgrade" in args:
        pair(args["upgrade"], f"{field}.upgrade")
    if args.get("channel") is not None:
        channel_ref(args["channel"], f"{field}.channel")


def _is_version(v: str) -> bool:
    """`releases.check_version`'s rule, as a test rather than an error."""
    return VERSION_RE.match(v) is not None and ".." not in v


def _pending(value: Any, states: Collection[str] | None, triggers: Collection[str] | None,
             effects: Collection[str] | None) -> None:
    p = obj(value, "pending")
    name(p.get("trigger", MISSING), "pending.trigger", triggers, "trigger", foreign=True)
    name(p.get("source", MISSING), "pending.source", states, "state", foreign=True)
    name(p.get("dest", MISSING), "pending.dest", states, "state", foreign=True)
    owed = array(p.get("effects", MISSING), "pending.effects")
    for i, effect in enumerate(owed):
        name(effect, f"pending.effects[{i}]", effects, "effect", foreign=True)
    count(p.get("done", MISSING), "pending.done", len(owed), "the number of effects")
    _args(p.get("args", MISSING), "pending.args")
    time(p.get("started", MISSING), "pending.started")


def _counters(value: Any) -> None:
    c = obj(value, "counters")
    for key in c:  # a later agent-fsm's counter is kept as it is: a count all the same
        if key not in COUNTERS:
            name(key, "counters", (), "counter", foreign=True)
            count(c[key], f"counters.{key}")
    for key in COUNTERS:
        count(c.get(key, MISSING), f"counters.{key}")


def state_body(data: Mapping[str, Any], states: Collection[str] | None = None,
               triggers: Collection[str] | None = None,
               effects: Collection[str] | None = None) -> None:
    """The state file's body (schema and checksum already checked), except its history summary.

    `state` must be one this reader knows. A pending transition and the counters may name a
    later agent-fsm's names: such a transition is never run here, such a counter kept.
    """
    name(data.get("state", MISSING), "state", states, "state")
    up = nullable(data, "upgrade")
    if up is not None:
        u = obj(up, "upgrade")
        version(u.get("from", MISSING), "upgrade.from")
        version(u.get("to", MISSING), "upgrade.to")
        time(u.get("started", MISSING), "upgrade.started")
        if "channel" in u:
            channel_ref(u["channel"], "upgrade.channel")
    pend = nullable(data, "pending")
    if pend is not None:
        _pending(pend, states, triggers, effects)
    last = nullable(data, "last_result")
    if last is not None:
        result_body(last, "last_result")
    if data.get("counters") is not None:
        _counters(data["counters"])
    if data.get("crash_loop") is not None:
        loop = obj(data["crash_loop"], "crash_loop")
        count(loop.get("seq", MISSING), "crash_loop.seq")
        name(loop.get("trigger", MISSING), "crash_loop.trigger", triggers, "trigger")
        count(loop.get("restarts", MISSING), "crash_loop.restarts")
        time(loop.get("first", MISSING), "crash_loop.first")
        time(loop.get("last", MISSING), "crash_loop.last")
