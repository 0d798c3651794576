"""The rules checked in every explored configuration (docs/design.md, "The rules, model-checked").

Each is named as docs/design.md names it; a violation is (name, what was seen).

- `converged-is-last-good`: settled in `converged` (nothing owed, no signal), the selected
  release is the last-good;
- `held-assets`: while a signal exists, every service asset on disk is the last-good's kept
  bytes (a missing one may still be restored; none other is ever there);
- `gate-means-done`: the gate open, there is no signal and no owed transition (but one that
  closes the gate and has run none of its effects yet: its write-ahead comes first);
- `restart-not-refused`: a transition that resets the start limit before its restart does not
  have that restart refused at the limit, unless its reset was let pass (checked on each step,
  `search.Checker._step`);
- `way-back-by-last-good`: a transition of the way back is recorded only by a process running
  the last-good's code (checked on each step: `step_violations`);
- `state-file-reads`: the state file always reads, by this agent-fsm and by the previous
  release's reader (the latter for every distinct state file at the end: `earlier_reader`);
- `known-bad-has-cause`: a known-bad mark only for a version that met a fault while it was
  selected (its checks failed, it crashed or hung, a kill, a full disk, ...; never a stop or a
  reboot, which are no verdict), whose starts were used up, or that an operator's `recover`
  rolled back;
- `judged-before-trusted`: the last-good is a version judged ok here, or installed or
  activated by an operator;
- `candidate-is-signalled`: a selected release neither last-good nor trusted is selected only
  while a signal names it, or, once the signal was lost on this path (the `signal` fault),
  while the state file still knows the upgrade (the start check refuses its starts and the way
  back selects the last-good);
- `way-back-selects-last-good`: rolling back (`recovering`, nothing owed), the last-good is
  selected;
- `releases-kept`: the releases the node may need are stored and intact (`releases_kept`);
- `store-swept`: an add or prune that succeeds leaves the store holding its releases, their
  records and the objects they link, and nothing else: what an earlier one cut midway left is
  gone (checked on each step: `leftovers`);
- `rolled-back-is-marked`: once a rollback of a version is recorded (`recover`, by the
  recovery unit or an operator), it is marked known bad, so an upgrade to it is refused unless
  forced; but not an orphan's (`orphaned_signal` from a state that knows no upgrade, and a
  `recover` finishing one: its result's class is `orphaned`, a candidate never judged here;
  `orphaned_signal` from a state that knew the upgrade owes the mark), and not where the mark's write failed
  and was let pass (the entry's `skipped` names `mark_known_bad`: the way back never waits on
  the mark), and once a later upgrade to it was judged ok here (`complete` clears the mark).
  The rollbacks recorded are the search's ghost set `rolled_back`;
- `abandoned-is-not-rolled-back`: an upgrade abandoned before its candidate started is not
  rolled back afterwards until begun again (checked on each step, with the search's ghost set
  `abandoned`);
- with an operator's `follow`, the follow's rules (`channel.py`, checked on each step);
- and, over the whole graph, `way-back-is-live` (bounded liveness, `search.liveness`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_fsm.machine.definition import Definition, Role
from agent_fsm.node.records import known_bad
from agent_fsm.wiring import Reader

WAY_BACK_ROLES = {Role.last_good, Role.recovery}


@dataclass(frozen=True)
class Seen:
    """What the node's files say, read back as a reader does."""

    state: str
    pending: str | None
    selected: str | None
    last_good: str | None
    signal: tuple[str, str, int, int] | None  # from, to, attempt, starts
    gate: bool
    assets: str  # whose rendering the assets on disk are: a version, "missing", "mixed"
    kept_ok: bool  # while a signal exists: every asset present is the last-good's
    marks: frozenset[str]
    unreadable: str | None  # why the state file did not read
    before_close: bool = False  # the owed transition closes the gate and has run nothing yet
    operators: bool = False  # the owed transition is an operator's
    releases: str | None = None  # what `releases-kept` found wrong, if anything
    stored: tuple[str, ...] = ()  # the releases the store shows
    last_result: tuple[str, str] | None = None  # the state file's `last_result`: to, outcome

    def summary(self) -> str:
        sig = "none" if self.signal is None else \
            f"{self.signal[0]}→{self.signal[1]} (attempt {self.signal[2]}, starts {self.signal[3]})"
        owes = f" owing {self.pending}" if self.pending else ""
        bad = f", known bad {','.join(sorted(self.marks))}" if self.marks else ""
        state = f"UNREADABLE ({self.unreadable})" if self.unreadable else self.state + owes
        return (f"{state}; selected {self.selected}, last-good {self.last_good}; signal {sig}; "
                f"gate {'open' if self.gate else 'shut'}; assets {self.assets}{bad}; releases "
                f"{', '.join(self.stored) or 'none'}")


def look(reader: Reader, rendered: Mapping[str, Mapping[str, bytes]]) -> Seen:
    """Read the node the way `status` does; `rendered`: each version's assets for this host."""
    unreadable = None
    state, pending = "?", None
    before_close = operators = False
    doc = None
    try:
        doc = reader.store.read()
        state = doc.state
        pending = None if doc.pending is None else doc.pending.trigger
        if doc.pending is not None:
            owed = doc.pending.effects
            # nothing of it has run yet (its write-ahead only): the gate is still as it was
            before_close = "close_gate" in owed and doc.pending.done == 0
            owner = reader.definition.transition(doc.pending.trigger)
            operators = tuple(owner.by) == (Role.operator,)
    except Exception as exc:
        unreadable = f"{type(exc).__name__}: {exc}"
    try:
        sig = reader.signal()
    except Exception:
        sig = None
    paths = reader.paths
    on_disk = {p.name: (p.read_bytes() if p.exists() else None)
               for p in (paths.agent_unit, paths.recovery_unit, paths.recovery_script)}
    owners = [v for v, files in rendered.items()
              if all(on_disk.get(name) == data for name, data in files.items())]
    if owners:
        assets = owners[0]
    elif all(v is None for v in on_disk.values()):
        assets = "missing"
    else:
        parts = []
        for name, data in sorted(on_disk.items()):
            whose = [v for v, files in rendered.items() if files.get(name) == data]
            parts.append(f"{name}={whose[0] if whose else ('missing' if data is None else '?')}")
        assets = "mixed (" + ", ".join(parts) + ")"
    last_good = reader.releases.last_good()
    kept_ok = True
    if sig is not None:
        kept = rendered.get(sig.from_version, {})
        kept_ok = all(data is None or kept.get(name) == data for name, data in on_disk.items())
    try:
        marks = frozenset(known_bad.read(paths.known_bad_file).marks)
    except Exception:
        marks = frozenset()
    return Seen(state, pending, reader.releases.selected(), last_good,
                None if sig is None else (sig.from_version, sig.to_version, sig.attempt,
                                          sig.starts),
                reader.gate.is_open(), assets, kept_ok, marks, unreadable, before_close,
                operators, releases_kept(reader, doc, sig), tuple(reader.releases.versions()),
                _last_result(doc))


def _last_result(doc: Any) -> tuple[str, str] | None:
    last = getattr(doc, "last_result", None)
    if not isinstance(last, dict):
        return None
    return str(last.get("to")), str(last.get("outcome"))


def releases_kept(reader: Reader, doc: Any, sig: Any) -> str | None:
    """`releases-kept`: what is wrong with the releases the node may need, or None. Needed:
    the selected (`ExecStart=` runs it), the last-good (the way back runs its `recover`), while
    a signal exists its from and, while the candidate may still run (not rolling back, and the
    state file knows its upgrade), its to (the judgment runs it), and each release the
    owed transition names (its resume selects or promotes it). Each must be stored and pass the
    store's own check (`Releases.verify`: what a start and `status`'s `selected_damaged` run),
    and so must every release the store shows: an add or prune cut midway leaves none half
    there."""
    needed: dict[str, list[str]] = {}

    def need(version: object, why: str) -> None:
        if isinstance(version, str):
            needed.setdefault(version, []).append(why)

    need(reader.releases.selected(), "selected")
    need(reader.releases.last_good(), "last-good")
    if sig is not None:
        need(sig.from_version, "the signal's from")
    # The candidate only while it may still run (judged, or completing): a rollback needs the
    # last-good alone, and a signal the state file does not know (restored, lost) is rolled
    # back unjudged.
    done_with = set(reader.groups.orphan_from) | set(reader.groups.rolling_back)
    back = doc is not None and doc.pending is not None and \
        reader.definition.transition(doc.pending.trigger).dest in reader.groups.rolling_back
    if sig is not None and (doc is None or (doc.state not in done_with and not back)
                            or (doc.pending is not None and not back)):
        need(sig.to_version, "the signal's to")
    if doc is not None and doc.pending is not None:
        args = doc.pending.args
        owed = f"owed {doc.pending.trigger}"
        need(args.get("release"), owed)
        need(args.get("from"), owed)
        if isinstance(args.get("upgrade"), dict):
            need(args["upgrade"].get("from"), owed)
            if not back:
                need(args["upgrade"].get("to"), owed)
    stored = reader.releases.versions()
    wrong = [f"{v} ({', '.join(why)}) is not stored" for v, why in needed.items()
             if v not in stored]
    for v in stored:
        try:
            reader.releases.verify(v)
        except Exception as exc:
            role = f" ({', '.join(needed[v])})" if v in needed else ""
            wrong.append(f"{v}{role} is damaged: {exc}")
    where = str(reader.paths.releases_dir)  # named as the store's, not this run's tmpfs
    return "; ".join(wrong).replace(where, "releases") or None


def violations(seen: Seen, evidence: frozenset[str], trusted: frozenset[str],
               rolled_back: frozenset[str] = frozenset(),
               judged: tuple[str, str] | None = None, *,
               signal_lost: bool = False) -> list[tuple[str, str]]:
    """`judged`: the last upgrade whose end was recorded on this path (to, outcome);
    `signal_lost`: the signal was lost on this path (the `signal` fault)."""
    out: list[tuple[str, str]] = []
    if seen.state == "converged" and seen.pending is None and seen.signal is None \
            and judged is not None and seen.last_result != judged:
        out.append(("result-recorded", f"settled after the upgrade to {judged[0]} ended "
                    f"{judged[1]}, but the state file's last_result says "
                    + ("nothing" if seen.last_result is None else
                       f"{seen.last_result[0]} {seen.last_result[1]}")))
    if seen.unreadable:
        out.append(("state-file-reads", seen.unreadable))
    # Settled: nothing owed and no signal (a signal the state file does not know, as a restored
    # state file leaves, is not settled: it is `orphaned_signal`'s to roll back).
    if seen.state == "converged" and seen.pending is None and seen.signal is None \
            and seen.selected != seen.last_good:
        out.append(("converged-is-last-good",
                    f"converged with {seen.selected} selected but {seen.last_good} last-good"))
    if not seen.kept_ok:
        out.append(("held-assets", f"a signal exists and the assets on disk are {seen.assets}, "
                                   f"not last-good {seen.signal and seen.signal[0]}'s"))
    # Owed, a transition that closes the gate may find it still open while none of its effects
    # has run (its write-ahead comes first); once one has, its close_gate must have been first.
    if seen.gate and (seen.signal is not None or (seen.pending is not None
                                                  and not seen.before_close)):
        out.append(("gate-means-done", "the gate is open with "
                    + ("a signal" if seen.signal is not None else f"{seen.pending} owed")))
    for version in sorted(seen.marks - evidence):
        out.append(("known-bad-has-cause", f"{version} is marked known bad, but it was never "
                    "judged failed, its start never failed and no operator rolled it back"))
    if seen.releases is not None:
        out.append(("releases-kept", seen.releases))
    for version in sorted(rolled_back - seen.marks):
        out.append(("rolled-back-is-marked", f"{version} rolled back here, but it is not marked "
                    "known bad (and its mark's write did not fail): an upgrade to it would not "
                    "be refused"))
    # Rolling back, the candidate's code never starts again: the last-good is selected before
    # the restart that the rollback owes (and a daemon's start runs what is selected).
    if seen.state == "recovering" and seen.pending is None and seen.unreadable is None \
            and seen.selected != seen.last_good:
        out.append(("way-back-selects-last-good", f"rolling back with nothing owed, and "
                    f"{seen.selected} is selected, not last-good {seen.last_good}: the next "
                    "start runs the candidate's code"))
    # A start runs what is selected: a release nobody trusts runs only as a signalled candidate,
    # its starts counted by the start check and its judgment due.
    known = seen.state not in ("idle", "converged") or seen.pending is not None
    if seen.selected is not None and seen.selected != seen.last_good \
            and seen.selected not in trusted \
            and (seen.signal is None or seen.signal[1] != seen.selected) \
            and not (signal_lost and seen.signal is None and known):
        out.append(("candidate-is-signalled", f"{seen.selected} is selected, neither last-good "
                    f"({seen.last_good}) nor judged ok here nor installed by an operator, and "
                    + ("no signal names it" if seen.signal is None else
                       f"the signal names {seen.signal[1]}")
                    + ": a start would run it unjudged, its starts uncounted"))
    if seen.last_good is not None and seen.last_good not in trusted:
        out.append(("judged-before-trusted", f"{seen.last_good} is last-good, but it was never "
                    "judged ok here nor installed or activated by an operator"))
    return out


def leftovers(releases_dir: Path) -> list[str]:
    """What the store holds besides its releases, their records (the usage record among them)
    and the objects they link:
    hidden staging copies and trees taken out, records of releases not stored, objects no
    release links (link count 1)."""
    from agent_fsm.node.releases import hashes, objects, store, usage

    kept = (store.DIGESTS, hashes.HASHED, objects.OBJECTS, usage.USAGE)
    out = sorted(p.name for p in releases_dir.glob(".*") if p.name not in kept)
    versions = {p.name for p in releases_dir.iterdir() if not p.name.startswith(".")}
    for kind in (store.DIGESTS, hashes.HASHED):
        out += sorted(f"{kind}/{p.name}" for p in (releases_dir / kind).glob("*")
                      if p.name not in versions)
    out += sorted(f"{objects.OBJECTS}/{p.name}" for p in (releases_dir / objects.OBJECTS).glob("*")
                  if p.stat().st_nlink == 1)
    return out


def way_back(definition: Definition, rolling_back: frozenset[str]) -> frozenset[str]:
    """The transitions of the way back: into or out of a rolling-back state, and only the
    last-good's code may fire them (`by`)."""
    return frozenset(t.trigger for t in definition.transitions if set(t.by) <= WAY_BACK_ROLES
                     and (t.dest in rolling_back or set(t.sources) & rolling_back))


def step_violations(fired: list[dict[str, Any]], code: str | None, last_good: str | None,
                    back: frozenset[str]) -> list[tuple[str, str]]:
    out = []
    for entry in fired:
        if entry.get("trigger") in back and not entry.get("superseded_by") and code != last_good:
            out.append(("way-back-by-last-good",
                        f"{entry['trigger']} was recorded by code of {code or 'an operator'}, "
                        f"while {last_good} is last-good"))
    return out


def installed_violations(command: str, release: str, seen: Seen,
                         loaded_on_disk: bool) -> list[tuple[str, str]]:
    """An operator's `install R` or `activate R` that exited 0 (`install-does-it`): R is selected
    and last-good, its assets are on disk and systemd has loaded its agent unit."""
    wrong = []
    if seen.selected != release:
        wrong.append(f"selected {seen.selected}")
    if seen.last_good != release:
        wrong.append(f"last-good {seen.last_good}")
    if seen.assets != release:
        wrong.append(f"assets {seen.assets}")
    if not loaded_on_disk:
        wrong.append("the agent unit file on disk not loaded by systemd")
    if not wrong:
        return []
    return [("install-does-it", f"`{command} {release}` exited 0, and left: {'; '.join(wrong)}")]
