"""What `status` reports: read without the lock, never blocking the daemon.

It answers an operator's two questions: what is happening (the state and what it means, the
versions, the signal with its age and deadline, the gate, the assets on disk and how they differ
from what the running version would write, the last result) and what may I do now (`next`: one
sentence and the commands to run). Every field of `Status.to_json` is documented in
docs/operations.md and pinned by tests/test_status.py.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from ..errors import AgentFsmError
from ..lifecycle.explain import situation
from ..lifecycle.states import StateName
from ..node import assets, hold, hook_failures, inhibitors, known_bad
from ..node.releases import natural_key
from ..node.signal import UpgradeSignal
from ..node.store import StateDoc
from ..wiring import Node

ROLES = ("agent unit", "recovery unit", "recovery script")


@dataclass(frozen=True)
class AssetView:
    """One service asset on disk, compared with what the selected release would write."""

    role: str
    path: str  # where it is (below --root, if any)
    host_path: str  # as systemd and the units name it
    on_disk: bool
    held: bool  # an upgrade is pending, so this file is the last-good's and is kept as it is
    compared: str  # "same", "differs", "mode_differs", "missing" or "unknown"
    diff: str | None  # a unified diff, on request, when the content differs

    def to_json(self) -> dict[str, Any]:
        return {"role": self.role, "path": self.path, "host_path": self.host_path,
                "on_disk": self.on_disk, "held": self.held, "compared": self.compared,
                "diff": self.diff}


@dataclass(frozen=True)
class NextAction:
    """What the operator may do now: one sentence, and the command lines for it."""

    summary: str
    commands: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"summary": self.summary, "commands": list(self.commands)}


@dataclass(frozen=True)
class Status:
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
    last_result: dict[str, Any] | None
    owed: dict[str, Any] | None
    skipped: tuple[dict[str, Any], ...]  # effects let fail since the last cycle began
    allowed: tuple[str, ...]
    next: NextAction
    hold: dict[str, Any] | None  # `agent-fsm hold`: null or {reason, since, until, ...}
    inhibitors: tuple[dict[str, Any], ...]  # the workloads' inhibitor files, stale ones marked
    hooks: tuple[dict[str, Any], ...]  # configured: {when, trigger, argv, failed}
    known_bad: tuple[tuple[dict[str, Any], ...], str | None] = ((), None)  # marks, damage

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
            "last_result": self.last_result,
            "owed": self.owed,
            "skipped": list(self.skipped),
            "allowed": list(self.allowed),
            "next": self.next.to_json(),
            "hold": self.hold,
            "inhibitors": list(self.inhibitors),
            "hooks": list(self.hooks),
            "known_bad": list(self.known_bad[0]), "known_bad_error": self.known_bad[1],
        }


def _signal_json(sig: UpgradeSignal, now: float, max_attempts: int) -> dict[str, Any]:
    return {**sig.to_json(), "max_attempts": max_attempts,
            "age_seconds": max(now - sig.started, 0.0),
            "deadline_in_seconds": sig.deadline - now}


def _assets(node: Node, held: bool, selected: str | None,
            diff: bool) -> tuple[tuple[AssetView, ...], str | None]:
    host = node.host
    paths = node.paths
    host_paths = (paths.host_agent_unit, paths.host_recovery_unit, paths.host_recovery_script)
    rendered: dict[str, tuple[bytes, int]] = {}
    error = None
    if selected is not None:
        try:
            rendered = {str(a.path): (a.content, a.mode)  # compared only: doctor checks digests
                        for a in assets.render(node.releases.path(selected), paths, selected)}
        except AgentFsmError as exc:  # a broken candidate must not break status
            error = str(exc)
    views = []
    for role, path, host_path in zip(ROLES, host.asset_paths(), host_paths, strict=True):
        try:
            on_disk: bytes | None = path.read_bytes()
            mode: int | None = path.stat().st_mode & 0o7777
        except FileNotFoundError:
            on_disk, mode = None, None
        want = rendered.get(str(path))
        text_diff = None
        if on_disk is None:
            compared = "missing"
        elif want is None:
            compared = "unknown"
        elif on_disk != want[0]:
            compared = "differs"
            if diff:
                text_diff = "".join(difflib.unified_diff(
                    on_disk.decode(errors="replace").splitlines(keepends=True),
                    want[0].decode(errors="replace").splitlines(keepends=True),
                    fromfile=f"{path} (on disk)", tofile=f"{path} ({selected} would write)"))
        elif mode != want[1]:
            compared = "mode_differs"
            if diff:
                text_diff = f"mode {mode:04o} on disk, {selected} would write {want[1]:04o}\n"
        else:
            compared = "same"
        views.append(AssetView(role, str(path), str(host_path), on_disk is not None,
                               held and on_disk is not None, compared, text_diff))
    return tuple(views), error


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


def next_action(node: Node, doc: StateDoc, sig: UpgradeSignal | None, gate_open: bool,
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


def status(node: Node, *, diff: bool = False, prog: str = "agent-fsm") -> Status:
    """The node as it is now. `diff` adds a unified diff for each asset that differs; `prog`
    prefixes the suggested commands (say, with the --config and --root this run was given)."""
    doc = node.store.read()
    now = node.clock.now()
    sig = node.signal()
    selected = node.releases.selected()
    releases = tuple(sorted(node.releases.versions(), key=natural_key))
    gate_open = node.gate.is_open()
    held = sig is not None
    assets, assets_error = _assets(node, held, selected, diff)
    owed = None
    if doc.pending is not None:
        p = doc.pending
        owed = {"trigger": p.trigger, "from": p.source, "to": p.dest,
                "effects": p.effects[p.done:]}
    action = next_action(node, doc, sig, gate_open, now, known_bad.without(node.paths, releases), prog)
    if owed is not None:
        action = NextAction(
            f"an interrupted {owed['trigger']} still owes {', '.join(owed['effects'])}, resumed "
            f"by the next agent-fsm operation or daemon start; then: {action.summary}",
            action.commands)
    candidate = sig.to_version if sig else (doc.upgrade.to_version if doc.upgrade else None)
    return Status(
        name=node.paths.name,
        time=now,
        state=doc.state,
        meaning=node.definition.state(doc.state).description,
        situation=situation(node.definition, doc),
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
        last_result=doc.last_result and {"reason": None, "reason_class": None, **doc.last_result},
        owed=owed,
        skipped=tuple(doc.skipped),
        allowed=node.controller.allowed(doc.state),
        next=action,
        hold=hold.view(node.paths, now),
        inhibitors=inhibitors.view(node.paths),
        hooks=hook_failures.view(node.config.hooks, node.paths.state_dir),
        known_bad=known_bad.view(node.paths),
    )
