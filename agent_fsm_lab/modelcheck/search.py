"""Breadth-first over one node's configurations: the real code's steps, the invariants in every
configuration, then bounded liveness over the fault-free steps.

A configuration is the node's files (`tree.Tree`) and the model's state (`units.Units`, the
clock, the faults and operator commands left, and three ghost sets the invariants need: the
versions with a cause for a known-bad mark, the versions trusted as last-good, and those whose
rollback was recorded with its mark owed; and, with a `follow`, the newest channel index it
believed, `channel.py`). Two
configurations with the same digest are one, so the search ends; the bound (faults, operator
commands, depth) is printed with every result.
"""

from __future__ import annotations

import itertools
import os
import shutil
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from agent_fsm.machine.vocabulary import Trigger
from agent_fsm.node.config import Config, Judgment
from agent_fsm.testing import FakeClock, FakePublisher, FakeSystemd
from agent_fsm.wiring import open_node, open_reader

from . import channel, invariants, restore
from .invariants import Seen
from .processes import STORE_COMMANDS, Fault, Host, Process, Ran, quiet, run, source_dir
from .tree import Tree
from .units import Units, start_limit, unit_label

CLOCK = 1_700_000_000.0
# the transitions that reload systemd where a unit file changed (`gate-after-reload`)
RELOADING = frozenset({"install", "activate", "complete", "complete_queued", "recovered",
                       "settle"})
YEAR = 365 * 86400.0
# The states in which the state file knows no upgrade: a signal found there is an orphan's (the
# shipped definition's `orphaned_signal` sources; a variant adding one does not make the upgrade
# its state file knew an orphan).
KNOWS_NONE = frozenset({"idle", "converged"})
# The transitions that reset the agent unit's start limit before restarting it (the shipped
# definition's: a variant dropping the reset does not take its restart out of the rule).
RESETTING = frozenset({"begin_upgrade", "recover", "abandon_upgrade", "orphaned_signal"})


@dataclass(frozen=True)
class Bound:
    name: str
    faults: int  # faults on one path, each of one kind below
    operator: int  # operator commands on one path (the first is the upgrade)
    depth: int  # steps on one path
    versions: tuple[str, ...] = ("1.0.0", "2.0.0")
    systemds: tuple[int, ...] = (252, 257)
    kinds: frozenset[str] = frozenset({"crash", "power", "enospc", "systemctl", "lock",
                                       "publisher", "candidate", "clock", "restore",
                                       "signal"})
    operator_commands: tuple[str, ...] = ("upgrade", "recover", "install", "activate")
    added: tuple[str, ...] = ("2.0.0", "3.0.0")  # what `release add` takes (packed at the start)
    once: frozenset[str] = frozenset()  # operator commands given at most once on a path
    power_at_every_op: bool = False  # power loss at every file operation, not kill points
    max_attempts: int = 2
    earlier_reader: bool = True  # the state files read by the previous release too
    # the first release's agent unit: as agent-fsm writes it now (no start limit), and as an
    # older release wrote it (`OLDER_START_LIMIT`), held through an upgrade from that release
    agent_units: tuple[str, ...] = ("current", "older")
    faulted: frozenset[str] | None = None  # the processes a fault hits (None: every one)

    def __str__(self) -> str:
        return (f"bound {self.name}: ≤{self.faults} fault(s) of {len(self.kinds)} kinds, "
                f"≤{self.operator} operator command(s), depth ≤{self.depth}, releases "
                f"{', '.join(self.versions)}"
                + (f" (`release add` of {', '.join(self.added)})"
                   if "add" in self.operator_commands else "")
                + ("" if self.faulted is None
                   else f", faults in {', '.join(sorted(self.faulted))} steps only")
                + f", systemd {' and '.join(map(str, self.systemds))}, "
                f"{self.versions[0]}'s agent unit {' and '.join(self.agent_units)}")


BOUNDS = {
    "small": Bound("small", faults=1, operator=1, depth=14,
                   operator_commands=("upgrade", "recover", "install", "activate", "add", "prune")),
    # two faults on one path: after the operator's upgrade or recover
    "deep": Bound("deep", faults=2, operator=1, depth=22,
                  operator_commands=("upgrade", "recover")),
    # the release store beside one upgrade: two commands on one path (an upgrade, then a prune
    # while the candidate is judged; an add or a prune cut midway, then the upgrade)
    "store": Bound("store", faults=1, operator=2, depth=16,
                   operator_commands=("upgrade", "add", "prune"), once=frozenset({"upgrade"})),
    # one upgrade after another on one path (2.0.0, then back to 1.0.0): whatever the first
    # left at work (a recovery unit its refused start queued) meets the second
    "again": Bound("again", faults=1, operator=2, depth=16, operator_commands=("upgrade",)),
    # each variant of the definition (`--mutants`): the small bound, on both systemds (their
    # `OnFailure=` differs: a variant equivalent on one may not be on the other)
    "mutant": Bound("mutant", faults=1, operator=1, depth=14, earlier_reader=False),
    # the operator's follow of a signed channel (`channel.ANSWERS`: the server's answer is the
    # search's choice), two on one path: a replay, or a known-bad version, after an index
    # believed; the faults in the follow's own steps (the upgrade it begins is judged without
    # one: the other bounds fault it), and of every kind everywhere (`follow-deep`)
    "follow": Bound("follow", faults=1, operator=2, depth=10, versions=channel.VERSIONS,
                    systemds=(257,), agent_units=("current",), operator_commands=("follow",),
                    kinds=frozenset({"crash", "power", "enospc"}),
                    faulted=frozenset({"follow"}), earlier_reader=False),
    "follow-deep": Bound("follow-deep", faults=1, operator=2, depth=14,
                         versions=channel.VERSIONS, systemds=(257,), agent_units=("current",),
                         operator_commands=("follow",)),
}


@dataclass(frozen=True)
class Config_:
    """The model's half of a configuration (the files are the other)."""

    units: Units
    clock: float
    faults: int
    operator: int
    evidence: frozenset[str]
    trusted: frozenset[str]
    unit: str = "current"  # the first release's agent unit (`Bound.agent_units`; in the files)
    rolled_back: frozenset[str] = frozenset()  # rollbacks recorded whose mark was not let pass
    given: frozenset[str] = frozenset()  # the bound's `once` commands given on this path
    # a reload let pass (`on_error = "log"`) left the agent unit file on disk unloaded: until
    # systemd loads it (a reload, a boot), an open gate need not wait for it
    reload_missed: bool = False
    judged: tuple[str, str] | None = None  # the last upgrade ended on this path: to, outcome
    abandoned: frozenset[str] = frozenset()  # upgrades abandoned and not begun again since
    signal_lost: bool = False  # the upgrade's signal was lost on this path (`signal`)
    index: int = 0  # the newest channel index a follow believed on this path (`channel`)


@dataclass
class State:
    key: tuple[object, ...]
    tree: Tree
    model: Config_
    seen: Seen
    depth: int
    parent: tuple[object, ...] | None = None
    via: Edge | None = None
    goal: bool = False
    calm: dict[str, tuple[object, ...]] = field(default_factory=dict)  # fault-free steps by process
    calm_edges: dict[str, Edge] = field(default_factory=dict)  # and what each did (traces)
    expanded: bool = False


@dataclass(frozen=True)
class Edge:
    process: Process
    fault: Fault | None
    who: str
    fired: tuple[str, ...]
    end: str
    units: str
    by_last_good: bool = False  # the last-good's own code ran (its files: read by this version)


@dataclass
class Violation:
    name: str
    detail: str
    trace: list[tuple[Edge | None, str]]  # (step, what is on disk after it), from the start


@dataclass
class Result:
    bound: Bound
    states: int = 0
    transitions: int = 0
    faults: int = 0  # steps with a fault taken
    depth: int = 0  # the deepest configuration reached
    k: int | None = None  # liveness: steps of daemon starts and retries to converged
    seconds: float = 0.0
    violations: list[Violation] = field(default_factory=list)
    fired: set[str] = field(default_factory=set)
    moves: set[tuple[str, str]] = field(default_factory=set)  # (trigger, the state it fired from)
    frontier: int = 0  # configurations at the depth bound (their faulty successors unexplored)
    parked: int = 0  # an operator's command died mid-way, nothing runs: waits for an operator
    parked_kinds: dict[str, int] = field(default_factory=dict)  # what those are, in words
    behaviour: frozenset[object] = frozenset()  # what every configuration showed (mutants)
    # (what a configuration showed, what the one it rests in once the faults stop showed)
    rests: frozenset[tuple[object, object]] = frozenset()
    earlier: str = "not asked"  # what the previous release's reader was given
    stopped: bool = False  # ended at its first violation (`stop_at_first`): the figures are partial

    def figures(self) -> str:
        return (f"{self.bound}\nstates explored {self.states}, transitions {self.transitions} "
                f"({self.faults} with a fault), depth reached {self.depth}, liveness K = "
                f"{self.k} ({self.parked} wait for an operator whose command died), "
                f"{self.seconds:.1f} s; previous release's reader: {self.earlier}; "
                f"triggers fired: {', '.join(sorted(self.fired))}")


def _host(root: Path, bound: Bound) -> tuple[Host, Config]:
    config = Config(name="agent", judgment=Judgment(deadline_seconds=60, soak_seconds=0,
                                                     max_attempts=bound.max_attempts,
                                                     checks=(("model-check",),)))
    node = open_node(config, root, systemd=FakeSystemd(), clock=FakeClock(t=CLOCK))
    paths = node.paths
    host = Host(root, config, bound.versions, paths.agent_unit_name, paths.recovery_unit_name,
                str(paths.agent_unit.relative_to(root)),
                str(paths.gate_file.parent.relative_to(root)), root.parent / "sources")
    return host, config


# The agent unit's start limit as units before 0.1.0 had it (StartLimitIntervalSec=0
# since): held from such a release, it is what the way back to it runs through.
OLDER_START_LIMIT = "StartLimitIntervalSec=300\nStartLimitBurst=${max_attempts}"


def _older_agent_unit() -> str:
    from importlib import resources

    text = (resources.files("agent_fsm") / "templates" / "agent.service").read_text()
    assert text.count("\nStartLimitIntervalSec=0\n") == 1, "the template's start limit moved"
    return text.replace("\nStartLimitIntervalSec=0\n", f"\n{OLDER_START_LIMIT}\n")


def _initial(host: Host, systemd: int, added: tuple[str, ...] = (), unit: str = "current",
             ) -> tuple[Tree, dict[str, dict[str, bytes]], bool]:
    """The node installed on the first release, converged, gate open, its agent running; every
    release stored by `release add` from its directory (which `release add` takes again: the
    releases share their files but `release.toml`, as packed ones share their code); `unit`
    "older": the first release's agent unit has the older start limit. Also whether the install
    enabled the agent unit."""
    from agent_fsm.actions.releases import packing, pruning
    from tests.helpers import make_world
    from tests.node.test_release_store import make_release

    if host.root.exists():
        shutil.rmtree(host.root)
    fake = FakeSystemd(systemd_version=systemd)
    world = make_world(host.root, host.config, fake, FakePublisher(), FakeClock(t=CLOCK))
    assert host.sources is not None
    extra = [v for v in added if v not in host.versions]
    for v in [*host.versions, *extra]:
        src = source_dir(host.sources, v)
        if unit == "older" and v == host.versions[0]:
            src = host.sources / f"rel-{v}-older-unit"
            if not src.exists():
                make_release(host.sources, v, "-older-unit")
                (src / "assets" / "agent.service").write_text(_older_agent_unit())
        elif not src.exists():
            make_release(host.sources, v)
        packing.add(src, world.node)
    world.installed(host.versions[0])
    rendered = {v: world.rendered(v) for v in [*host.versions, *extra]}
    if extra:  # stored only to render them: taken out again, as a prune does
        pruning.prune(world.node, tuple(extra))
    return Tree.take(host.root), rendered, ("enable", host.agent_unit) in fake.calls


class Checker:
    def __init__(self, bound: Bound, *, progress: Callable[[str], None] | None = None,
                 stop_at_first: bool = False) -> None:
        self.bound = bound
        self.stop_at_first = stop_at_first  # a variant broken once needs no more search
        self.progress = progress
        self.states: dict[tuple[object, ...], State] = {}
        self.result = Result(bound)
        self.rendered: dict[tuple[int, str], dict[str, dict[str, bytes]]] = {}
        self.initial: dict[tuple[int, str], Tree] = {}  # each first configuration (`restore`)
        self.back: frozenset[str] = frozenset()
        self.seen_violation: set[str] = set()
        self.rest: dict[tuple[object, ...], tuple[object, ...]] = {}  # where each one rests
        self.channel: channel.Channel | None = None  # when the operator follows a channel

    # Exploring ------------------------------------------------------------------------------
    def run(self) -> Result:
        began = time.monotonic()
        # tmpfs where there is one: the check's fsyncs are the product's, not the point
        where = "/dev/shm" if Path("/dev/shm").is_dir() and os.access("/dev/shm", os.W_OK) else None
        with quiet(), tempfile.TemporaryDirectory(prefix="agent-fsm-modelcheck-",
                                                  dir=where) as tmp, \
                pytest.MonkeyPatch.context() as mp:
            _definition_once(mp)
            root = Path(tmp) / "node"
            host, config = _host(root, self.bound)
            self.host = host
            follows = "follow" in self.bound.operator_commands
            probe = open_node(config, root, systemd=FakeSystemd())
            self.releases_rel = probe.paths.releases_dir.relative_to(root)
            self.back = invariants.way_back(probe.definition, frozenset(probe.groups.rolling_back))
            self.orphan_from = frozenset(probe.groups.orphan_from)
            self.paths = tuple(str(p.relative_to(root)) for p in (
                probe.paths.state_dir, probe.paths.state_file, probe.paths.signal_file))
            queue: deque[tuple[object, ...]] = deque()
            for systemd in self.bound.systemds:
                for unit in self.bound.agent_units:
                    tree, rendered, enabled = _initial(host, systemd, self._added(), unit)
                    if follows:
                        if self.channel is None:
                            self.channel = channel.prepare(root, Path(tmp) / "keys", config,
                                                           CLOCK)
                            host = self.host = replace(host, channel=self.channel)
                        channel.install(root, self.channel)
                        tree = Tree.take(root)
                    self.rendered[systemd, unit] = rendered
                    self.initial[systemd, unit] = tree
                    # its agent started longer than the start limit's interval ago
                    on_disk = tree.file(host.agent_unit_rel)
                    units = Units(systemd=systemd, agent=f"active:{self.bound.versions[0]}",
                                  limit=start_limit(on_disk), loaded=unit_label(on_disk),
                                  enabled=enabled)
                    model = Config_(units, CLOCK, self.bound.faults, self.bound.operator,
                                    frozenset({channel.MARKED}) if follows else frozenset(),
                                    frozenset({self.bound.versions[0]}), unit=unit)
                    state = self._state(tree, model, 0, None, None)
                    if state is not None:
                        queue.append(state.key)
            shown = -1
            while queue and not self._stop():
                key = queue.popleft()
                state = self.states[key]
                if state.depth >= self.bound.depth:
                    self.result.frontier += 1
                    continue
                for child in self._expand(state, calm_only=False):
                    queue.append(child)
                if self.progress and state.depth > shown:
                    shown = state.depth
                    self.progress(f"depth {shown}: {len(self.states)} states, queue {len(queue)}, "
                                  f"{time.monotonic() - began:.0f} s")
            if not self._stop():
                self.liveness()
            if self.bound.earlier_reader and not self._stop():
                self._earlier_reads(probe.paths.state_file.relative_to(root),
                                    probe.paths.signal_file.relative_to(root))
        self.result.states = len(self.states)
        self.result.behaviour = frozenset((s.seen, s.model.units.key()) for s in self.states.values())
        shows = {k: (s.seen, s.model.units.key()) for k, s in self.states.items()}
        self.result.rests = frozenset((shows[k], shows[r]) for k, r in self.rest.items())
        self.result.seconds = time.monotonic() - began
        return self.result

    def _expand(self, state: State, *, calm_only: bool) -> Iterator[tuple[object, ...]]:
        """Run every process that may run in `state`, with and without a fault; yield the keys
        of configurations not seen before."""
        state.expanded = True
        m = state.model
        for process, calm in self._processes(state):
            if calm_only and not calm:
                continue
            clean = self._step(state, process, None)
            if clean is None:
                continue
            key, ran, new = clean
            if calm:
                state.calm[process.kind] = key
            if new:
                yield key
            if calm_only or m.faults <= 0 or (self.bound.faulted is not None
                                              and process.kind not in self.bound.faulted):
                continue
            for fault in self._faults(ran, process):
                stepped = self._step(state, process, fault)
                if stepped is not None and stepped[2]:
                    yield stepped[0]
        if not calm_only and m.faults > 0 and "clock" in self.bound.kinds and m.clock == CLOCK:
            for delta in (-YEAR, YEAR):
                model = replace(m, clock=m.clock + delta, faults=m.faults - 1)
                edge = Edge(Process("clock"), Fault("clock", f"{delta / 86400:+.0f}d"),
                            "the wall clock steps", (), f"{delta / 86400:+.0f} days", "")
                child = self._state(state.tree, model, state.depth + 1, state.key, edge)
                self.result.transitions += 1
                self.result.faults += 1
                if child is not None:
                    yield child.key
        if not calm_only and m.faults > 0 and "restore" in self.bound.kinds:
            yield from self._restores(state)
        if not calm_only and m.faults > 0 and "signal" in self.bound.kinds:
            yield from self._signal_lost(state)

    def _orphaned_result(self) -> bool:
        """Whether the result the step just recorded is an orphan's (`orphaned_signal`, and a
        `recover` finishing one): its candidate was never judged here, so nothing is marked."""
        from agent_fsm.node.state import reasons

        try:
            doc = open_reader(self.host.config, self.host.root).store.read()
        except Exception:
            return False
        return (doc.last_result or {}).get("reason_class") == reasons.ORPHANED

    def _restores(self, state: State) -> Iterator[tuple[object, ...]]:
        """Between two steps, the state file (and what travels with it) put back as it was in
        the initial configuration (`restore`): only while a signal exists and the state file
        knows the upgrade (a state the orphan check does not roll back from, or one owing a
        transition), so that a signal is left that the state file does not know."""
        seen, m = state.seen, state.model
        if seen.signal is None or (seen.state in self.orphan_from and seen.pending is None):
            return
        paths = self.paths
        for how, tree in restore.restored(state.tree, self.initial[m.units.systemd, m.unit],
                                          paths[0], paths[1], paths[2]):
            edge = Edge(Process("restore"), Fault("restore", how), restore.WHO[how], (),
                        "no process runs", "")
            # The whole state dir put back puts back its known-bad record too: the marks the
            # node made since are gone with it, not dropped by agent-fsm (the first
            # configuration knows no rollback). So is its channel record: the index it
            # believed is forgotten, and an older one is believed again, as on a new node.
            back = frozenset() if how == "state-dir" else m.rolled_back
            index = 0 if how == "state-dir" else m.index
            child = self._state(tree, replace(m, faults=m.faults - 1, rolled_back=back,
                                              index=index),
                                state.depth + 1,
                                state.key, edge)
            self.result.transitions += 1
            self.result.faults += 1
            if child is not None:
                yield child.key

    def _signal_lost(self, state: State) -> Iterator[tuple[object, ...]]:
        """Between two steps, the upgrade's signal lost (`signal`: a check or an operator
        deletes it, the disk loses it) while the state file knows the upgrade: the way back
        must roll it back from what the state file names alone."""
        seen, m = state.seen, state.model
        if seen.signal is None or (seen.state in self.orphan_from and seen.pending is None):
            return
        tree = Tree(tuple(e for e in state.tree.entries if e[0] != self.paths[2]))
        edge = Edge(Process("lose"), Fault("signal", "lost"), "the upgrade signal is deleted",
                    (), "no process runs", "")
        child = self._state(tree, replace(m, faults=m.faults - 1, signal_lost=True),
                            state.depth + 1, state.key, edge)
        self.result.transitions += 1
        self.result.faults += 1
        if child is not None:
            yield child.key

    def _processes(self, state: State) -> Iterator[tuple[Process, bool]]:
        u = state.model.units
        if u.agent == "activating":
            yield Process("start"), True
        if u.agent.startswith(("exec:", "stopping:")):
            yield Process("daemon"), True
        if u.recovery == "activating":
            yield Process("recovery"), True
        s = state.seen
        if u.agent.startswith("active:") and (s.operators or s.pending is not None or s.signal
                                              or s.state != "converged" or not s.gate):
            yield Process("poll"), True  # the serving daemon looks: work a command left
        if state.model.operator > 0:
            for command in self.bound.operator_commands:
                if command in state.model.given:
                    continue
                if command == "recover":
                    yield Process("recover"), False
                    continue
                if command == "prune":
                    yield Process("prune"), False
                    continue
                if command == "follow":
                    for answer in channel.ANSWERS:
                        yield Process("follow", answer.label), False
                    continue
                for v in self.bound.added if command == "add" else self._versions():
                    if command == "upgrade" and v == state.seen.selected:
                        continue
                    yield Process(command, v), False

    def _added(self) -> tuple[str, ...]:
        return self.bound.added if "add" in self.bound.operator_commands else ()

    def _versions(self) -> tuple[str, ...]:
        """The versions an operator names: those stored at the start, and those added later."""
        return tuple(dict.fromkeys([*self.bound.versions, *self._added()]))

    def _faults(self, ran: Ran, process: Process) -> Iterator[Fault]:
        kinds = self.bound.kinds
        if process.kind in STORE_COMMANDS:  # no failpoint of the engine: its file operations
            for kind, on in (("crash-op", "crash"), ("power-op", "power")):
                if on in kinds:
                    for k in range(1, ran.file_ops + 1):
                        yield Fault(kind, k)
            kinds = kinds - {"crash", "power"}
        if "crash" in kinds:
            first = 0 if process.kind in ("daemon", "recovery") else 1
            for k in range(first, ran.kill_points + 1):
                yield Fault("crash", k)
        if "power" in kinds:
            if self.bound.power_at_every_op:
                for k in range(1, ran.file_ops + 1):
                    yield Fault("power-op", k)
            else:
                for k in range(1, ran.kill_points + 1):
                    yield Fault("power", k)
        if "enospc" in kinds:
            for k in range(1, ran.writes + 1):
                yield Fault("enospc", k)
        if "systemctl" in kinds:
            for verb in sorted(ran.verbs):
                yield Fault("systemctl", verb)
        if "lock" in kinds and ran.locked:
            yield Fault("lock")
        if "publisher" in kinds and ran.published:
            yield Fault("publisher", "dead")
            yield Fault("publisher", "once")
        if "candidate" in kinds and ran.judged:
            for how in ("checks", "crash", "hang", "stop"):
                yield Fault("candidate", how)

    def _step(self, state: State, process: Process, fault: Fault | None,
              ) -> tuple[tuple[object, ...], Ran, bool] | None:
        m = state.model
        sig = state.seen.signal
        ran = run(self.host, state.tree, m.units, m.clock, process, fault,
                  None if sig is None else sig[1])
        self.result.transitions += 1
        if fault is not None:
            self.result.faults += 1
        evidence, trusted, rolled_back = set(m.evidence), set(m.trusted), set(m.rolled_back)
        reload_missed, judged, abandoned = m.reload_missed, m.judged, set(m.abandoned)
        fired, broke = [], []
        for entry in ran.fired:
            trigger = entry.get("trigger")
            self.result.fired.add(str(trigger))
            up = entry.get("upgrade") or {}
            to = up.get("to") if isinstance(up, dict) else None
            words = f"{trigger} {entry.get('from')}→{entry.get('to')}"
            if entry.get("superseded_by"):
                words = f"{trigger} superseded by {entry['superseded_by']}"
                fired.append(words)
                if trigger == Trigger.begin_upgrade and entry.get("release") \
                        and entry["superseded_by"] == Trigger.abandon_upgrade:
                    abandoned.add(str(entry["release"]))  # its candidate never started
                continue
            if trigger == Trigger.begin_upgrade and to:
                abandoned.discard(str(to))
            if trigger in (Trigger.recover, Trigger.orphaned_signal) and to \
                    and str(to) in abandoned:
                broke.append(("abandoned-is-not-rolled-back", f"{trigger} rolled back the "
                              f"upgrade to {to}, which was abandoned before its candidate "
                              "started (and not begun again)"))
            self.result.moves.add((str(trigger), str(entry.get("from"))))
            missed = any(str(s.get("effect")).startswith("reload_systemd")
                         for s in entry.get("skipped") or ())
            if missed or trigger in RELOADING:  # the excuse lasts until the next one reloads
                reload_missed = missed
            if entry.get("skipped"):
                words += " (skipped: " + "; ".join(f"{s['effect']}: {s['error']}"
                                                   for s in entry["skipped"]) + ")"
            fired.append(words)
            if trigger == Trigger.recover and to and not any(
                    s.get("effect") == "mark_known_bad" for s in entry.get("skipped") or ()) \
                    and not self._orphaned_result():
                rolled_back.add(str(to))  # its mark is owed (unless its write failed: let pass)
            if trigger == Trigger.orphaned_signal and to and entry.get("from") not in KNOWS_NONE:
                # a rollback of an upgrade the state file knew, taken for an orphan's: its
                # candidate ran here, so its mark is owed as any rollback's
                rolled_back.add(str(to))
            if trigger in (Trigger.complete, Trigger.complete_queued) and to:
                rolled_back.discard(str(to))  # judged ok here since: its mark is cleared
            if to and trigger in (Trigger.complete, Trigger.complete_queued, Trigger.judge_failed,
                                  Trigger.recover, Trigger.orphaned_signal):
                ok = trigger in (Trigger.complete, Trigger.complete_queued)
                judged = (str(to), "ok" if ok else "rolled_back")  # its result is recorded
            if trigger == Trigger.judge_ok and to and ran.judged and (
                    fault is None or fault.kind != "candidate"):
                trusted.add(str(to))  # its checks ran in this process, and passed
            if trigger in (Trigger.install, Trigger.activate) and entry.get("release"):
                trusted.add(str(entry["release"]))
            if trigger == Trigger.recover and process.kind == "recover" and to:
                evidence.add(str(to))  # an operator's verdict
        # A cause for the candidate's mark: a fault while it was selected (but a stop, which is
        # no verdict), its starts used up, or an operator's rollback (above).
        stop = fault is not None and fault.kind == "candidate" and fault.at == "stop"
        if sig is not None and (ran.refused or (fault is not None and fault.kind != "clock"
                                                and not stop and state.seen.selected == sig[1])):
            evidence.add(sig[1])
        if process.kind in ("install", "activate") and process.version:
            trusted.add(process.version)  # the operator's own hand
        newest = m.index
        if self.channel is not None:
            assert ran.tree is not None
            rules, newest = channel.step_rules(
                self.channel, process.version if process.kind == "follow" else None, state.tree,
                ran.tree, m.clock, state.seen.marks, m.index, ran.fired, state.seen.pending)
            broke.extend(rules)
        model = Config_(ran.units, m.clock, m.faults - (fault is not None),
                        m.operator - (process.kind not in ("start", "daemon", "recovery", "poll")),
                        frozenset(evidence), frozenset(trusted), unit=m.unit,
                        rolled_back=frozenset(rolled_back),
                        given=m.given | ({process.kind} & self.bound.once),
                        judged=judged, abandoned=frozenset(abandoned),
                        signal_lost=m.signal_lost, index=newest,
                        reload_missed=reload_missed and ran.units.loaded != unit_label(
                            ran.tree.file(self.host.agent_unit_rel) if ran.tree else None))
        edge = Edge(process, fault, ran.who, tuple(fired), ran.end, _units_words(ran.units),
                    ran.code is not None and ran.code == ran.last_good_before)
        assert ran.tree is not None
        for name, detail in [*invariants.step_violations(ran.fired, ran.code,
                                                          ran.last_good_before, self.back),
                             *broke]:
            self._violation(name, detail, state, edge, None)
        if process.kind in STORE_COMMANDS and fault is None and ran.end.startswith("exit 0"):
            left = invariants.leftovers(self.host.root / self.releases_rel)
            if left:
                self._violation("store-swept", f"{ran.who} succeeded and left in the store "
                                f"{', '.join(left)}", state, edge, None)
        if "traceback" in ran.end:  # the harness's own failure or the product's: never silent
            self._violation("no-traceback", f"{ran.who} ended with {ran.end}", state, edge, None)
        if fault is None:
            state.calm_edges[process.kind] = edge
        before = len(self.states)
        child = self._state(ran.tree, model, state.depth + 1, state.key, edge, live=True)
        if child is None:
            return None
        # (a fault of the candidate's own behaviour, the clock's or the publisher's leaves
        # systemctl and the process alone: its judgment may be what failed)
        if (fault is None or fault.kind in ("candidate", "clock", "publisher")) \
                and ran.units.recovery != "activating" and any(
                e.get("trigger") == Trigger.judge_failed and not e.get("superseded_by")
                for e in ran.fired):
            self._violation("judged-failed-starts-recovery", f"{ran.who} recorded judge_failed "
                            "and ended with the recovery unit not started: the way back waits "
                            "on another start", state, edge, None)
        if ran.units.agent == "failed" and (fault is None or fault.kind != "systemctl"):
            for entry in ran.fired:
                if entry.get("trigger") in RESETTING and not entry.get("superseded_by") and not any(
                        s.get("effect") == "reset_start_limit" for s in entry.get("skipped") or ()):
                    self._violation("restart-not-refused", f"{ran.who} recorded "
                                    f"{entry['trigger']}, and systemd refused the restart it "
                                    "queued at the agent unit's start limit (left failed, "
                                    "start-limit-hit), though its reset was not let pass",
                                    state, edge, None)
        if process.kind in ("install", "activate") and process.version \
                and ran.end.startswith("exit 0") and not ran.died:
            on_disk = unit_label(ran.tree.file(self.host.agent_unit_rel))
            for name, detail in invariants.installed_violations(
                    process.kind, process.version, child.seen, ran.units.loaded == on_disk):
                self._violation(name, detail, state, edge, None)
        return child.key, ran, len(self.states) > before

    def _state(self, tree: Tree, model: Config_, depth: int, parent: tuple[object, ...] | None,
               via: Edge | None, *, live: bool = False) -> State | None:
        key = (tree.digest(self.bound.max_attempts + 1), model.units.key(), model.clock,
               model.faults, model.operator, model.evidence, model.trusted, model.rolled_back,
               model.given, model.reload_missed, model.judged, model.abandoned,
               model.signal_lost, model.index)
        if key in self.states:
            return self.states[key]
        if not live:
            tree.put(self.host.root)
        reader = open_reader(self.host.config, self.host.root, clock=FakeClock(t=model.clock))
        rendered = self.rendered[model.units.systemd, model.unit]
        seen = invariants.look(reader, rendered)
        state = State(key, tree, model, seen, depth, parent, via)
        state.goal = (seen.state == "converged" and seen.pending is None and seen.signal is None
                      and seen.gate and seen.selected == seen.last_good
                      and seen.assets == seen.selected
                      and model.units.agent == f"active:{seen.selected}"
                      and model.units.recovery == "inactive")
        self.states[key] = state
        self.result.depth = max(self.result.depth, depth)
        on_disk = unit_label(tree.file(self.host.agent_unit_rel))
        if (seen.state == "converged" and seen.pending is None and seen.signal is None
                and seen.gate and model.units.loaded != on_disk and not model.reload_missed):
            self._violation("gate-after-reload", "the gate is open, nothing owed, and systemd "
                            f"has not loaded the agent unit file on disk ({on_disk or 'none'}; "
                            f"loaded: {model.units.loaded or 'none'}), though no reload failed",
                            state, None, None)
        for name, detail in invariants.violations(seen, model.evidence, model.trusted,
                                                  model.rolled_back, model.judged,
                                                  signal_lost=model.signal_lost):
            self._violation(name, detail, state, None, None)
        return state

    # Liveness ---------------------------------------------------------------------------------
    def _next_calm(self, state: State) -> tuple[object, ...] | None:
        """The fault-free step systemd takes next, without an operator: a queued recovery
        first (the agent unit's restart waits `RestartSec=`), then the exec'd daemon, then the
        agent unit's start, then the serving daemon's look; None when nothing runs."""
        enabled = {p.kind for p, calm in self._processes(state) if calm}
        for kind in ("recovery", "daemon", "start", "poll"):
            if kind not in enabled:
                continue
            if kind not in state.calm:
                stepped = self._step(state, Process(kind), None)
                if stepped is None:
                    return None
                state.calm[kind] = stepped[0]
            return state.calm[kind]
        return None

    def _calm_edge(self, prev: tuple[object, ...], key: tuple[object, ...]) -> Edge | None:
        """The fault-free step `_next_calm` took from `prev` to `key` (a configuration's `via`
        is the step that first reached it, from wherever)."""
        state = self.states[prev]
        for kind in ("recovery", "daemon", "start"):
            if state.calm.get(kind) == key and kind in state.calm_edges:
                return state.calm_edges[kind]
        return self.states[key].via

    def liveness(self) -> None:
        """From every configuration, once faults stop and no operator acts, systemd's own
        schedule (`_next_calm`) reaches converged with the gate open, the last-good's agent
        running and its assets on disk: K is the most steps any configuration needs. One that
        never does (a dead end, or a loop) is a violation, shown with the path to it and the
        fault-free steps from it."""
        dist: dict[tuple[object, ...], int] = {}
        worst = 0
        todo = deque(self.states)
        while todo and not self._stop():
            key = todo.popleft()
            if key in dist:
                continue
            chain: list[tuple[object, ...]] = []
            on_chain: set[tuple[object, ...]] = set()
            cur: tuple[object, ...] | None = key
            while cur is not None and cur not in dist and not self.states[cur].goal \
                    and cur not in on_chain:
                chain.append(cur)
                on_chain.add(cur)
                cur = self._next_calm(self.states[cur])
            if cur is not None and dist.get(cur) == -1:
                for k in chain:
                    dist[k] = -1  # leads into a configuration already found not live
                continue
            if cur is not None and (cur in dist or self.states[cur].goal):
                d = dist.get(cur, 0)
                dist.setdefault(cur, d)
                rest = self.rest.setdefault(cur, cur)
                for k in reversed(chain):
                    d += 1
                    dist[k] = d
                    self.rest[k] = rest
                worst = max(worst, dist[key])
                continue
            for k in chain:
                dist[k] = -1
            start = self.states[chain[0]]
            if cur is None and start.seen.operators:
                # An operator's command died mid-way and nothing runs: it waits for the
                # operator (or the agent's next start); counted and printed, not a violation.
                self.result.parked += 1
                kind = self._parked_words(start)
                self.result.parked_kinds[kind] = self.result.parked_kinds.get(kind, 0) + 1
                continue
            walk = [(self._calm_edge(prev, k), self.states[k].seen.summary() + "; "
                     + _units_words(self.states[k].model.units))
                    for prev, k in itertools.pairwise(chain)]
            if cur is not None:
                walk.append((self._calm_edge(chain[-1], cur),
                             "(back to a configuration above: a loop)"))
            why = "a loop" if cur is not None else "nothing runs any more"
            self._violation("way-back-is-live", "from here, with no fault and no operator, the "
                            f"node never reaches converged with the gate open ({why})", start,
                            None, walk)
        self.result.k = worst

    def _parked_words(self, state: State) -> str:
        """A parked configuration in words: the state, the owed transition and how far it got,
        the signal, the releases, the agent unit."""
        reader = open_reader(self.host.config, self.host.root)
        raw = state.tree.file(str(reader.paths.state_file.relative_to(self.host.root)))
        owed = "?"
        if raw is not None:
            pending = reader.store.decode(raw).pending
            if pending is not None:
                owed = (f"{pending.trigger} after {pending.done}/{len(pending.effects)} "
                        f"({', '.join(pending.effects[:pending.done]) or 'no effect'} done)")
        s = state.seen
        return (f"{s.state} owing {owed}; signal {'yes' if s.signal else 'none'}; selected "
                f"{s.selected}, last-good {s.last_good}; gate {'open' if s.gate else 'shut'}; "
                f"agent unit {state.model.units.agent}")

    def _earlier_reads(self, state_rel: Path, signal_rel: Path) -> None:
        """`state-file-reads` by the previous release's reader, for every distinct state file
        (with its signal) that a process other than the last-good's own code wrote: the
        previous release meets a file as the last-good of a candidate of this one (or after an
        operator's command), never one its successor wrote as the last-good, which only this
        version's code reads (a state file left as its parent's is its parent's)."""
        from . import earlier

        first: dict[tuple[bytes, bytes | None], State] = {}
        for s in self.states.values():
            data = s.tree.file(str(state_rel))
            if data is None:
                continue
            if s.parent is not None and s.via is not None:
                before = self.states[s.parent].tree.file(str(state_rel))
                if before == data or s.via.by_last_good:
                    continue
            first.setdefault((data, s.tree.file(str(signal_rel))), s)
        pairs = list(first)
        why, errors = earlier.unreadable(pairs, str(state_rel), str(signal_rel))
        commit = (earlier.earlier_commit() or "?")[:12]
        self.result.earlier = why or f"{len(pairs)} distinct state files read by {commit}"
        for d, error in sorted(errors.items()):
            state = first[pairs[int(Path(d).name[1:])]]
            self._violation("state-file-reads", f"the previous release's reader: {error}",
                            state, None, None)

    def _stop(self) -> bool:
        self.result.stopped = self.stop_at_first and bool(self.result.violations)
        return self.result.stopped

    # Traces -----------------------------------------------------------------------------------
    def trace(self, state: State) -> list[tuple[Edge | None, str]]:
        steps: list[tuple[Edge | None, str]] = []
        s: State | None = state
        while s is not None:
            steps.append((s.via, s.seen.summary() + f"; {_units_words(s.model.units)}"))
            s = self.states[s.parent] if s.parent is not None else None
        return list(reversed(steps))

    def _violation(self, name: str, detail: str, state: State, edge: Edge | None,
                   tail: list[tuple[Edge | None, str]] | None) -> None:
        if name in self.seen_violation:  # BFS: the first found is a shortest
            return
        self.seen_violation.add(name)
        trace = self.trace(state)
        if edge is not None:
            trace.append((edge, "(the step above broke the rule)"))
        if tail:
            trace.append((None, "… then, with no fault and no operator:"))
            trace.extend(tail)
        self.result.violations.append(Violation(name, detail, trace))


def _definition_once(mp: pytest.MonkeyPatch) -> None:
    """Every process of the check parses the same definition: parse it once."""
    from agent_fsm.machine import reading
    from agent_fsm.upgrade import registry

    shipped, loaded = reading.shipped(), registry.load_definition()
    load = registry.load_definition
    mp.setattr(reading, "shipped", lambda: shipped)
    mp.setattr(registry, "load_definition",
               lambda text=None, source="<text>": loaded if text is None else load(text, source))
    # ... and what is derived from it, wherever a module imported it by name
    from agent_fsm.machine import hooks, vocabulary

    for fn in (vocabulary.groups, vocabulary.count_rules, hooks.before_triggers):
        memo: dict[tuple[int, ...], Any] = {}

        def once(*args: Any, _fn: Any = fn, _memo: dict[tuple[int, ...], Any] = memo) -> Any:
            key = tuple(id(a) for a in args)
            if key not in _memo:
                _memo[key] = (_fn(*args), args)  # the args kept alive: their ids stay theirs
            return _memo[key][0]

        for module in [m for name, m in sys.modules.items() if name.startswith("agent_fsm.")]:
            for attr, value in list(vars(module).items()):
                if value is fn:
                    mp.setattr(module, attr, once)


def _units_words(u: Units) -> str:
    limit = "no start limit" if u.limit is None else f"start limit {u.starts}/{u.limit}"
    loaded = "none" if u.loaded is None else u.loaded.split(":")[0] + "'s"
    return (f"systemd {u.systemd}: agent unit {u.agent} (NRestarts {u.agent_restarts}, "
            f"{limit}, {loaded} unit file loaded{'' if u.enabled else ', disabled'}), "
            f"recovery unit {u.recovery}")


def check(bound: Bound, progress: Callable[[str], None] | None = None, *,
          stop_at_first: bool = False) -> Result:
    return Checker(bound, progress=progress, stop_at_first=stop_at_first).run()


def _unused(*_: Any) -> None:
    pass
