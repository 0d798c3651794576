"""What `status` reports: read without the lock, never blocking the daemon.

What is happening: the state and its meaning, the versions, the signal with its age and deadline,
the gate, the assets on disk against what the running version would write, the last result. What may
I do now: `next`, a sentence and the commands. docs/operations.md documents every field of
`Status.to_json`, and tests/views/test_status.py pins them.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, NamedTuple

from ...errors import ReleaseError
from ...machine.definition import situation
from ...machine.vocabulary import COMMANDS, Trigger
from ...node.channel import record as channel_record
from ...node.records import hold, hook_failures, known_bad, known_good
from ...node.releases import usage
from ...node.releases.pointers import natural_key
from ...node.runtime import inhibitors
from ...node.runtime import workload as workload_state
from ...node.runtime.signal import UpgradeSignal
from ...node.state.document import Pending
from ...node.state.store import CRASH_LOOP_WINDOW, OWED_CHECK_SECONDS, StateDoc
from ...system import unit_state
from .advice import NextAction, crash_looping, next_action
from .advice import span as span  # render.py's durations
from .assets import AssetView, compare
from .units import Units
from .units import advise as advise_units
from .units import read as read_units

if TYPE_CHECKING:
    from ...wiring import Node, Reader


class Status(NamedTuple):
    """The node as `status` shows it; `to_json` is the `status --json` object."""

    name: str
    time: float
    state: str
    meaning: str
    situation: str
    tone: str  # how the state reads: "ok", "none" (not installed), "busy" or "bad"
    state_since: float | None
    state_seconds: float | None
    selected: str | None
    last_good: str | None
    candidate: str | None
    releases: tuple[str, ...]
    signal: dict[str, Any] | None
    gate: str
    held_assets: tuple[str, ...]
    assets: tuple[AssetView, ...]
    assets_compared_with: str | None
    assets_error: str | None
    # The selected release, checked while the agent unit does not run, fails its digest or is
    # missing: null, or {version, problem}. The daemon refuses to start it, so `next` says how to
    # fix it.
    selected_damaged: dict[str, str] | None
    last_result: dict[str, Any] | None
    owed: dict[str, Any] | None
    skipped: tuple[dict[str, Any], ...]  # effects let fail since the last cycle began
    allowed: tuple[str, ...]  # the operator's triggers the state allows (`vocabulary.COMMANDS`)
    next: NextAction
    hold: dict[str, Any] | None  # `agent-fsm hold`: null or {reason, since, until, ...}
    inhibitors: tuple[dict[str, Any], ...]  # the workloads' inhibitor files, stale ones marked
    hooks: tuple[dict[str, Any], ...]  # configured: {when, trigger, argv, failed}
    known_bad: tuple[tuple[dict[str, Any], ...], str | None] = ((), None)  # marks, damage
    units: Units | None = None  # what systemd says of the units, the state dir's writes
    unit_situation: str | None = None  # the units' situation (units.Advice.kind), if any
    outbox: dict[str, Any] | None = None  # {queued, publisher_unreachable_since}
    # The live config is wrong and the way back runs with the last-good's kept settings: null, or
    # {error, version, kept} (`config.Fallback`); read through those settings.
    config_fallback: dict[str, str] | None = None
    crash_loop: dict[str, Any] | None = None  # null, or {restarts, since, last}
    workload: dict[str, Any] | None = None  # null (none declared), or `runtime.workload.view`
    # What the way back last did to a damaged last-good: null, or {time, release, action
    # ("repaired", "fell_back"), to, files, more, reason, words} (`records.known_good`).
    way_back: dict[str, Any] | None = None
    store: usage.StoreBytes | None = None  # what the store takes on disk, the room left
    # The signed channel the node follows: null, or `node.channel.record.view`.
    channel: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "time": self.time,
            "state": self.state,
            "meaning": self.meaning,
            "situation": self.situation,
            "state_since": self.state_since,
            "state_seconds": self.state_seconds,
            "selected": self.selected,
            "last_good": self.last_good,
            "candidate": self.candidate,
            "releases": list(self.releases),
            "signal": self.signal,
            "gate": self.gate,
            "held_assets": list(self.held_assets),
            "assets": [a.to_json() for a in self.assets],
            "assets_compared_with": self.assets_compared_with,
            "assets_error": self.assets_error,
            "selected_damaged": self.selected_damaged,
            "last_result": self.last_result,
            "owed": self.owed,
            "skipped": list(self.skipped),
            "allowed": list(self.allowed),
            "next": self.next.to_json(),
            "hold": self.hold,
            "inhibitors": list(self.inhibitors),
            "hooks": list(self.hooks),
            "known_bad": list(self.known_bad[0]), "known_bad_error": self.known_bad[1],
            "units": None if self.units is None else self.units.to_json(),
            "unit_situation": self.unit_situation,
            "outbox": self.outbox,
            "config_fallback": self.config_fallback,
            "crash_loop": self.crash_loop,
            "workload": self.workload,
            "way_back": self.way_back,
            "store": None if self.store is None else self.store.to_json(),
            "channel": self.channel,
        }


def _signal_json(sig: UpgradeSignal, now: float, max_attempts: int) -> dict[str, Any]:
    return {**sig.to_json(), "max_attempts": max_attempts,
            "age_seconds": max(now - sig.started, 0.0),
            "deadline_in_seconds": sig.deadline - now}


def crash_loop(doc: StateDoc, now: float) -> dict[str, Any] | None:
    """The crash loop the node is in: the latest transition is a start after a crash, less than
    CRASH_LOOP_WINDOW ago (`store.Store.record`). Else None."""
    loop = doc.crash_loop
    if loop is None or loop["seq"] != doc.seq or now - loop["last"] >= CRASH_LOOP_WINDOW:
        return None
    return {"restarts": loop["restarts"], "since": loop["first"], "last": loop["last"]}


def _unknown(node: Node | Reader, p: Pending) -> list[str]:
    """What an owed transition names that this agent-fsm does not know. `Controller.unknown`'s rule,
    read off the definition: `status` has no engine."""
    d = node.definition
    effects = {e.name for t in d.transitions for e in t.effects}
    names = [] if p.trigger in {t.trigger for t in d.transitions} else [f"trigger {p.trigger}"]
    names += [f"state {s}" for s in dict.fromkeys((p.source, p.dest)) if s not in d.state_names]
    return names + [f"effect {e}" for e in dict.fromkeys(p.effects) if e not in effects]


def damaged(node: Node | Reader, version: str | None) -> dict[str, str] | None:
    """{version, problem} when the release `version` is not what was stored or is gone; None when it
    is intact or None. Checked by its files' stats, as a start checks it. A change that keeps them
    (bit rot) is for `doctor` and `release list`, which hash every file."""
    if version is None:
        return None
    try:
        node.releases.verify(version)
    except ReleaseError as exc:
        return {"version": version, "problem": str(exc)}
    except FileNotFoundError:
        return {"version": version, "problem": f"release {version} is selected but is not in "
                f"{node.paths.releases_dir}; add it again with `agent-fsm release add DIR`"}
    return None


def _repair(bad: dict[str, str], last_good: str | None, unit: str, prog: str) -> NextAction:
    """What to do about a damaged selected release on a node with no upgrade pending."""
    v = bad["version"]
    back = (f", or switch back to the last-good {last_good}" if last_good not in (None, v)
            else "")
    return NextAction(
        f"the selected release {v} is damaged and the agent cannot start it: add release {v} "
        f"again from its directory (it replaces the damaged copy) and restart the agent{back}",
        (f"{prog} release add DIR", f"systemctl restart {unit}",
         *((f"{prog} activate --to {last_good}",) if back else ())))


def status(node: Node | Reader, *, diff: bool = False, prog: str = "agent-fsm") -> Status:
    """The node as it is now. `diff` adds a unified diff for each asset that differs. `prog`
    prefixes the suggested commands (say, with this run's --config and --root)."""
    doc = node.store.read()
    now = node.clock.now()
    sig = node.signal()
    selected = node.releases.selected()
    releases = tuple(sorted(node.releases.versions(), key=natural_key))
    gate_open = node.gate.is_open()
    held = sig is not None
    assets, assets_error = compare(node.paths, node.releases, held, selected, diff)
    owed = None
    if doc.pending is not None:
        p = doc.pending
        owed = {"trigger": p.trigger, "from": p.source, "to": p.dest,
                "effects": p.effects[p.done:], "unknown": _unknown(node, p)}
    action = next_action(node, doc, sig, gate_open, now, known_bad.without(node.paths, releases), prog)
    units = read_units(node)
    advice = advise_units(units, node, doc, prog)  # the units can say more than the state file
    now_line = situation(node.definition, doc) if advice is None else advice.situation
    if advice is not None:
        action = advice.next
    loop = crash_loop(doc, now)
    if loop is not None and advice is None:  # a failed unit's advice says more: it is not restarted
        action = crash_looping(action, loop, now, node.paths.agent_unit_name)
    outbox = _outbox(node, doc.last_result)
    if outbox["publisher_unreachable_since"] is not None and advice is None:
        now_line += (f"; the result is queued, publisher unreachable since "
                     f"{_utc(outbox['publisher_unreachable_since'])}")
    if owed is not None and owed["unknown"]:  # a later agent-fsm's: never run here
        back = doc.state in node.definition.transition(Trigger.recover).sources
        action = NextAction(
            f"a later agent-fsm left {owed['trigger']} owed ({', '.join(owed['unknown'])} "
            "unknown here): this one never runs it; " + (
                "the way back (`recover`) supersedes it" if back else
                "run the agent-fsm that wrote it"), (f"{prog} recover",) if back else ())
    elif owed is not None and doc.pending is not None and node.definition \
            .finished_for_a_dead_command(doc.pending.trigger, doc.pending.args):
        in_place = doc.pending.trigger == Trigger.begin_upgrade \
            and node.releases.selected() == node.releases.last_good()
        how = (f"abandons it within {OWED_CHECK_SECONDS:g}s, its workload left running"
               if in_place else f"restarts {node.paths.agent_unit_name} within "
               f"{OWED_CHECK_SECONDS:g}s to finish it")
        action = NextAction(
            f"an interrupted {owed['trigger']} still owes {', '.join(owed['effects'])}: once the "
            f"command that ran it is gone, the running agent {how} (as the next agent-fsm "
            f"operation or daemon start would); then: {action.summary}",
            action.commands)
    elif owed is not None:
        action = NextAction(
            f"an interrupted {owed['trigger']} still owes {', '.join(owed['effects'])}, resumed "
            f"by the next agent-fsm operation or daemon start; then: {action.summary}",
            action.commands)
    work = workload_state.view(node.paths, selected, str(node.config.workload.user or "root"))
    if work is not None and not work["running"] and sig is None and advice is None:
        ident = node.config.workload.identifier or node.paths.name
        now_line += (f"; its workload is not running (its log: journalctl -t {ident}; systemd "
                     "restarts the unit when it exits)")
    candidate = sig.to_version if sig else (doc.upgrade.to_version if doc.upgrade else None)
    # Only while the agent unit is known not to run: a running agent checked its release at its
    # start, and walking ~1,000 entries is a third of what `status --json` costs.
    down = units.agent is not None and (units.agent.active, units.agent.sub) != ("active",
                                                                                 "running")
    bad = damaged(node, selected) if down else None
    if bad is not None and sig is None and owed is None:  # with a signal the way back goes on
        action = _repair(bad, node.releases.last_good(), node.paths.agent_unit_name, prog)
    return Status(
        name=node.paths.name,
        time=now,
        state=doc.state,
        meaning=node.definition.state(doc.state).description,
        situation=now_line,
        tone=node.groups.tone(doc.state, node.definition.initial),
        state_since=doc.since,
        state_seconds=None if doc.since is None else max(now - doc.since, 0.0),
        selected=selected,
        last_good=node.releases.last_good(),
        candidate=candidate,
        releases=releases,
        signal=None if sig is None else _signal_json(sig, now, node.config.judgment.max_attempts),
        gate="open" if gate_open else "closed",
        held_assets=tuple(a.path for a in assets if a.held),
        assets=assets,
        assets_compared_with=selected,
        assets_error=assets_error,
        selected_damaged=bad,
        last_result=doc.last_result and {"reason": None, "reason_class": None,
                                         "publisher_unreachable_since": None, "channel": None,
                                         **doc.last_result},
        owed=owed,
        skipped=tuple(doc.skipped),
        allowed=tuple(t for t in node.definition.triggers_from(doc.state) if t in COMMANDS),
        next=action,
        hold=hold.view(node.paths, now),
        inhibitors=inhibitors.view(node.paths),
        hooks=hook_failures.view(node.config.hooks, node.paths.state_dir),
        known_bad=known_bad.view(node.paths),
        units=units,
        unit_situation=None if advice is None else advice.kind,
        outbox=outbox,
        config_fallback=None if node.config.fallback is None else node.config.fallback.to_json(),
        crash_loop=loop,
        workload=work,
        way_back=_way_back(node),
        store=usage.seen(node.paths.releases_dir),
        channel=_channel(node, selected, now),
    )


def _channel(node: Node | Reader, selected: str | None, now: float) -> dict[str, Any] | None:
    """The channel and its last follow (`channel_record.view`), with the follow timer as systemd has
    it. `timer`: its ActiveState, or "unknown". `next_run`: null when none is due or systemd cannot
    say. `waiting`: see `_waiting`."""
    view = channel_record.view(node.paths.channel_dir, node.config.channel.url,
                               node.config.channel.name)
    if view is None:
        return None
    try:
        active, _, at = unit_state.timer(node.config.systemctl, node.paths.follow_timer_name)
    except unit_state.Unread:
        active, at = "unknown", None
    return {**view, "timer": active, "next_run": at,
            "waiting": _waiting(view, selected, active, at, now)}


def _waiting(view: dict[str, Any], selected: str | None, active: str, at: float | None,
             now: float) -> dict[str, Any] | None:
    """Null while no follow is due. Else the node is outside its window until the timer's next run,
    and `eligible` names versions its last follow found eligible, newer than the selected one, and
    did not take. A follow then takes the newest of them."""
    if active != "active" or at is None or at <= now:
        return None
    newer = [a["version"] for a in view["available"] if a["why_not"] is None
             and a["version"] != view["took"]
             and (selected is None or natural_key(a["version"]) > natural_key(selected))]
    return {"reason": "outside the window", "next_run": at, "eligible": newer}


def _way_back(node: Node | Reader) -> dict[str, Any] | None:
    event = known_good.read_or_empty(node.paths.known_good_file).way_back
    return None if event is None else {**event.to_json(), "words": event.words()}


def _utc(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def _outbox(node: Node | Reader, last: dict[str, Any] | None) -> dict[str, Any]:
    """How many results wait for delivery. While the last one `complete_queued` queued still waits,
    also since when the publisher was unreachable."""
    try:
        queued = sum(1 for p in node.paths.outbox_dir.iterdir() if p.suffix == ".json")
    except OSError:
        queued = 0
    since = (last or {}).get("publisher_unreachable_since")
    return {"queued": queued, "publisher_unreachable_since": since if queued else None}
