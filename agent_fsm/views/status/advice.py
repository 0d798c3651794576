"""What `status` says to do now: one sentence and its command lines, by what a start does from the
state (its `on_start` in states/agent-upgrade.toml)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from ...machine.definition import OnStart, handlers
from ...node.releases.pointers import natural_key
from ...node.runtime.signal import UpgradeSignal
from ...node.state.store import StateDoc
from ...upgrade.way_back import is_orphan

if TYPE_CHECKING:
    from ...wiring import Node, Reader


class NextAction(NamedTuple):
    """What the operator may do now: one sentence, and the command lines for it."""

    summary: str
    commands: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"summary": self.summary, "commands": list(self.commands)}


def span(seconds: float) -> str:
    """A duration for people: 0.4s, 42s, 3m05s, 2h04m, 3d02h."""
    s = abs(seconds)
    if s < 10:
        return f"{s:.1f}s"
    if s < 60:
        return f"{s:.0f}s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{m}m{sec:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


class _Seen(NamedTuple):
    """What the advice for a state is given: the node as read, and the words it uses."""

    node: Node | Reader
    doc: StateDoc
    sig: UpgradeSignal | None
    gate_open: bool
    now: float
    releases: tuple[str, ...]
    prog: str
    selected: str | None
    last_good: str | None
    unit: str
    journal: str
    recover: str
    to: str


def next_action(node: Node | Reader, doc: StateDoc, sig: UpgradeSignal | None, gate_open: bool,
                now: float, releases: tuple[str, ...], prog: str) -> NextAction:
    """The one thing to do now, following what a start does from the state (its `on_start`); every
    command given is one the operator may run."""
    unit = node.paths.agent_unit_name
    journal = f"journalctl -u {unit} -n 50"
    seen = _Seen(node, doc, sig, gate_open, now, releases, prog,
                 selected=node.releases.selected(), last_good=node.releases.last_good(),
                 unit=unit, journal=journal, recover=f"{prog} recover",
                 to=sig.to_version if sig else (doc.upgrade.to_version if doc.upgrade else "?"))
    if is_orphan(node.groups, doc.state, sig):
        assert sig is not None
        return NextAction(f"an upgrade signal ({sig.from_version} → {sig.to_version}) exists but "
                          f"the state file knows no upgrade: the candidate was never judged "
                          f"here; roll back to the last-good ({seen.last_good})", (seen.recover,))
    try:
        on_start = node.definition.state(doc.state).on_start
    except KeyError:
        return NextAction(f"unknown state {doc.state}; see the journal", (journal,))
    return ADVICE[on_start](seen)


def restarts(count: int, since: str, last: str) -> str:
    """Starts after a crash in words, by their count, `last` saying when the latest was ("3m ago",
    "at T"). One restart is not a loop."""
    return (f"restarted once after a crash, {last}" if count == 1 else
            f"crash-looping: {count} restarts since {since}, the last {last}")


def crash_looping(action: NextAction, loop: dict[str, Any], now: float, unit: str) -> NextAction:
    """`action` after the words for the starts after a crash (`restarts`)."""
    from datetime import UTC, datetime  # only for a node restarted after a crash

    since = datetime.fromtimestamp(loop["since"], UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    how = ("see why it crashed in its journal" if loop["restarts"] == 1 else
           "systemd keeps restarting it, with growing delays where it can: see why in its journal")
    words = restarts(loop["restarts"], since, f"{span(now - loop['last'])} ago")
    return NextAction(
        f"{words}; {unit}: {how}; then: {action.summary}",
        (f"journalctl -u {unit} -n 50", *action.commands))


def _install(s: _Seen) -> NextAction:
    if s.releases:
        newest = max(s.releases, key=natural_key)
        return NextAction(f"install a release (stored: {', '.join(s.releases)})",
                          (f"{s.prog} install --version {newest}",))
    return NextAction("add a release, then install it",
                      (f"{s.prog} release add DIR", f"{s.prog} install --version V"))


def _await_judgment(s: _Seen) -> NextAction:
    if s.sig is None:
        return NextAction("the state file says an upgrade is pending but there is no signal; "
                          "roll back to be safe", (s.recover,))
    left = s.sig.deadline - s.now
    when = (f"deadline in {span(left)}" if left >= 0
            else f"the deadline passed {span(left)} ago; see {s.journal}")
    return NextAction(
        f"wait for the judgment of {s.to} (attempt {max(s.sig.attempt, s.sig.starts)} of "
        f"{s.node.config.judgment.max_attempts}, {when}); or roll back now", (s.recover,))


def _await_publish(s: _Seen) -> NextAction:
    return NextAction(
        f"wait: the result of the upgrade to {s.to} is being published, then the gate opens; "
        f"if it stays here, publishing is failing and is retried: see the journal", (s.journal,))


def _await_recovery_unit(s: _Seen) -> NextAction:
    return NextAction(
        f"wait: {s.node.paths.recovery_unit_name} rolls back to {s.last_good}; if it stays "
        f"here, roll back now", (s.recover,))


def _await_last_good(s: _Seen) -> NextAction:
    if s.selected == s.last_good:
        return NextAction(
            f"wait: {s.last_good} restarts through {s.unit}, clears the signal and opens the "
            f"gate; if it stays here, run recovery again", (s.recover, s.journal))
    return NextAction(f"roll back: {s.selected} is still selected, the last-good is "
                      f"{s.last_good}", (s.recover,))


def _await_gate_or_upgrade(s: _Seen) -> NextAction:
    if not s.gate_open:
        return NextAction(f"wait: {s.unit} opens the gate once it has started; if the gate "
                          "stays closed, look at the unit and its journal",
                          (f"systemctl status {s.unit}", s.journal))
    newer = [v for v in s.releases
             if s.selected is None or natural_key(v) > natural_key(s.selected)]
    if newer:
        target = max(newer, key=natural_key)
        return NextAction(f"nothing pending; upgrade when ready (newer stored: "
                          f"{', '.join(sorted(newer, key=natural_key))})",
                          (f"{s.prog} upgrade --to {target} --wait",))
    return NextAction("nothing pending; to upgrade, add a newer release first",
                      (f"{s.prog} release add DIR", f"{s.prog} upgrade --to V --wait"))


# What to do now in each state, by what a start does there (its `on_start`).
ADVICE: Mapping[OnStart, Callable[[_Seen], NextAction]] = handlers(OnStart, {
    OnStart.refuse_not_installed: _install,
    OnStart.judge_candidate: _await_judgment,
    OnStart.publish_then_open_gate: _await_publish,
    OnStart.start_recovery_unit: _await_recovery_unit,
    OnStart.finish_recovery: _await_last_good,
    OnStart.converge_then_open_gate: _await_gate_or_upgrade,
}, "`status` (its next action)")
