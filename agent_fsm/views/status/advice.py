"""What `status` says to do now: one sentence and the command lines for it, by state."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from ...machine.vocabulary import StateName
from ...node.releases.pointers import natural_key
from ...node.runtime.signal import UpgradeSignal
from ...node.state.store import StateDoc

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


def next_action(node: Node | Reader, doc: StateDoc, sig: UpgradeSignal | None, gate_open: bool,
                now: float, releases: tuple[str, ...], prog: str) -> NextAction:
    """The one thing to do now, by state; every command given is one the operator may run."""
    unit = node.paths.agent_unit_name
    recovery = node.paths.recovery_unit_name
    selected = node.releases.selected()
    last_good = node.releases.last_good()
    journal = f"journalctl -u {unit} -n 50"
    recover = f"{prog} recover"
    to = sig.to_version if sig else (doc.upgrade.to_version if doc.upgrade else "?")
    state = doc.state
    if sig is not None and state not in node.groups.pending:
        return NextAction(f"an upgrade signal ({sig.from_version} → {sig.to_version}) exists but "
                          f"the state file knows no upgrade: the candidate was never judged "
                          f"here; roll back to the last-good ({last_good})", (recover,))
    if state == StateName.idle:
        if releases:
            newest = max(releases, key=natural_key)
            return NextAction(f"install a release (stored: {', '.join(releases)})",
                              (f"{prog} install --version {newest}",))
        return NextAction("add a release, then install it",
                          (f"{prog} release add DIR", f"{prog} install --version V"))
    if state == StateName.candidate_running:
        if sig is None:
            return NextAction("the state file says an upgrade is pending but there is no signal; "
                              "roll back to be safe", (recover,))
        left = sig.deadline - now
        when = (f"deadline in {span(left)}" if left >= 0
                else f"the deadline passed {span(left)} ago; see {journal}")
        return NextAction(
            f"wait for the judgment of {to} (attempt {sig.attempt} of "
            f"{node.config.judgment.max_attempts}, {when}); or roll back now", (recover,))
    if state == StateName.judged_ok:
        return NextAction(
            f"wait: the result of the upgrade to {to} is being published, then the gate opens; "
            f"if it stays here, publishing is failing and is retried: see the journal", (journal,))
    if state == StateName.judged_failed:
        return NextAction(
            f"wait: {recovery} rolls back to {last_good}; if it stays here, roll back now",
            (recover,))
    if state == StateName.recovering:
        if selected == last_good:
            return NextAction(
                f"wait: {last_good} restarts through {unit}, clears the signal and opens the "
                f"gate; if it stays here, run recovery again", (recover, journal))
        return NextAction(f"roll back: {selected} is still selected, the last-good is "
                          f"{last_good}", (recover,))
    if state == StateName.converged and not gate_open:
        return NextAction(f"wait: {unit} opens the gate once it has started; if the gate stays "
                          "closed, look at the unit and its journal",
                          (f"systemctl status {unit}", journal))
    if state == StateName.converged:
        newer = [v for v in releases
                 if selected is None or natural_key(v) > natural_key(selected)]
        if newer:
            target = max(newer, key=natural_key)
            return NextAction(f"nothing pending; upgrade when ready (newer stored: "
                              f"{', '.join(sorted(newer, key=natural_key))})",
                              (f"{prog} upgrade --to {target} --wait",))
        return NextAction("nothing pending; to upgrade, add a newer release first",
                          (f"{prog} release add DIR", f"{prog} upgrade --to V --wait"))
    return NextAction(f"unknown state {state}; see the journal", (journal,))
