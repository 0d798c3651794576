"""A history entry: what a recorded transition may hold, checked field by field.

Its names may be a later agent-fsm's (a candidate's transitions, read on the way back): they
pass as names, and nothing here acts on them. A new entry key needs its checker in
`OPTIONAL_ENTRY_KEYS`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any, NamedTuple

from .reasons import CLASSES, MAX_REASON
from .validate import (
    MAX_TIME,
    MISSING,
    _is_version,
    array,
    count,
    invalid,
    name,
    nullable,
    obj,
    one_of,
    pair,
    time,
    version,
)


class Names(NamedTuple):
    """The machine's names a file may use; None accepts any (a reader built for a test)."""

    states: Collection[str] | None = None
    triggers: Collection[str] | None = None
    effects: Collection[str] | None = None


def _superseded_by(value: Any, field: str, names: Names) -> None:
    name(value, field, names.triggers, "trigger", foreign=True)


def _skipped(value: Any, field: str, names: Names) -> None:
    for i, skip in enumerate(array(value, field)):
        s = obj(skip, f"{field}[{i}]")
        name(s.get("effect", MISSING), f"{field}[{i}].effect", names.effects, "effect",
             foreign=True)
        if not isinstance(s.get("error", MISSING), str):
            raise invalid(f"{field}[{i}].error", s.get("error", MISSING), "a string")


def _reason(value: Any, field: str, names: Names) -> None:
    if not isinstance(value, str) or len(value) > MAX_REASON:
        raise invalid(field, value, f"a string of at most {MAX_REASON} characters")


def _reason_class(value: Any, field: str, names: Names) -> None:
    one_of(value, field, CLASSES)


def _restarts(value: Any, field: str, names: Names) -> None:
    count(value, field)


def _first(value: Any, field: str, names: Names) -> None:
    time(value, field)


def _unknown(value: Any, field: str, names: Names) -> None:
    if not all(isinstance(n, str) for n in array(value, field)):
        raise invalid(field, value, "a list of strings")


# Keys kept by some entries only, each with its checker: the trigger that superseded this owed
# transition (and the names of it unknown here), the tolerant effects that failed and were let
# pass, why the result it reported came out so (`reasons.entry_keys`). A new one is one line
# here.
OPTIONAL_ENTRY_KEYS: dict[str, Callable[[Any, str, Names], None]] = {
    "superseded_by": _superseded_by,
    "unknown": _unknown,  # what a superseded transition named that this agent-fsm did not know
    "skipped": _skipped,
    "reason": _reason,
    "reason_class": _reason_class,
    # a start after a crash: the restarts of its crash loop so far, and when the first was
    "restarts": _restarts,
    "first": _first,
}
_COMMON_KEYS = frozenset({"time", "trigger", "from", "to", "release", "upgrade"})


def _entry(value: Any, field: str, names: Names) -> None:
    e = obj(value, field)
    time(e.get("time", MISSING), f"{field}.time")
    name(e.get("trigger", MISSING), f"{field}.trigger", names.triggers, "trigger", foreign=True)
    name(e.get("from", MISSING), f"{field}.from", names.states, "state", foreign=True)
    name(e.get("to", MISSING), f"{field}.to", names.states, "state", foreign=True)
    version(e.get("release", MISSING), f"{field}.release", optional=True)
    pair(e.get("upgrade", MISSING), f"{field}.upgrade")
    for key, check in OPTIONAL_ENTRY_KEYS.items():
        if key in e:
            check(e[key], f"{field}.{key}", names)


def history_entry(e: Any, field: str, names: Names, versions: set[str] | None = None) -> None:
    """One history entry (a journal line), with its `seq` if it is a journal entry.

    A common entry is checked without building a message; any other goes to `_entry`, which
    names the field it refuses.
    """
    if type(e) is dict and e.keys() - {"seq"} == _COMMON_KEYS \
            and _common(e, names.states, names.triggers, set() if versions is None else versions):
        return
    _entry(e, field, names)


def _common(e: dict[str, Any], states: Collection[str] | None,
            triggers: Collection[str] | None, versions: set[str]) -> bool:
    t, trigger, source, dest = e.get("time"), e.get("trigger"), e.get("from"), e.get("to")
    if type(t) is not float or not 0 <= t <= MAX_TIME or type(trigger) is not str \
            or type(source) is not str or type(dest) is not str \
            or (triggers is not None and trigger not in triggers) \
            or (states is not None and (source not in states or dest not in states)):
        return False
    up, release = e.get("upgrade"), e.get("release", MISSING)
    found = () if up is None else (up.get("from"), up.get("to")) if type(up) is dict else (0,)
    for v in found if release is None else (release, *found):
        if type(v) is not str:
            return False
        if v not in versions:
            if not _is_version(v):
                return False
            versions.add(v)
    return True


def _cycle_skipped(value: Any, names: Names) -> None:
    """Tolerant effects that failed since the latest cycle began, each with its transition."""
    for i, skip in enumerate(array(value, "skipped")):
        s = obj(skip, f"skipped[{i}]")
        time(s.get("time", MISSING), f"skipped[{i}].time")
        name(s.get("trigger", MISSING), f"skipped[{i}].trigger", names.triggers, "trigger",
             foreign=True)
    _skipped([{k: v for k, v in s.items() if k in ("effect", "error")} for s in value],
             "skipped", names)


def journal_fields(data: Mapping[str, Any], names: Names) -> None:
    """What the state file keeps of its journal (schema 2), so `status` and `metrics` never read it."""
    count(data.get("seq", MISSING), "seq")
    for key in ("since", "last_transition"):
        value = nullable(data, key)
        if value is not None:
            time(value, key)
    _cycle_skipped(data.get("skipped", MISSING), names)

