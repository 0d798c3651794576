"""One process step of a node, run for real on its files: the process is the only thing modelled.

A step puts a configuration's files back into the work directory, starts one process as
systemd or an operator would (the agent unit's `ExecStartPre=` start check, the daemon of the
release `ExecStart=` resolved, the recovery unit's `recover`, an operator's command) and runs
agent-fsm's own code for it: `start_check`, `Daemon.startup`, the serving daemon's
`DeadCommand.finish`, `recover`, `install`, `activate`, `begin_upgrade`,
and for `release add DIR` and `release prune --keep 0` what those commands run
(`sources.add_source`, `pruning.prune`), with the engine, the effects, the store and the files
all real. What crosses
the process boundary is the model's: `systemctl` (`units.ModelSystemd`), the publish command, the
host's checks and the candidate's workload, the clocks, and at most one fault per step:

- `crash k`: SIGKILL at the k-th kill point (before each effect and before each final record,
  the engine's failpoints, and just after each journal append, before the state write that
  commits it: the points tests/reliability/test_crash_points.py enumerates);
- `crash-op k`: SIGKILL at the k-th file operation of a `release add` or `prune`, which meet
  no failpoint of the engine (links, renames and directories counted, as
  tests/reliability/test_store_power_loss.py counts them; nothing after it runs, no `finally`
  either); `power-op k` there is the same cut with the power lost;
- `power k`: the power goes out at the k-th kill point (or, `power-op k`, the k-th file
  operation): what was not fsynced is lost (tests/reliability/powerloss.py), and the host boots;
- `enospc k`: the disk is full from the k-th write on, for the rest of the process;
- `systemctl VERB`: every `systemctl VERB` this process runs fails;
- `lock`: another command holds the writers' lock for longer than this process waits;
- `publisher dead` / `publisher once`: the publish command fails every time / the first time;
- `candidate checks|crash|hang|stop`: the candidate's checks fail, its workload dies, its start
  hangs until systemd's start timeout stops it, or the host reboots during its judgment (a
  clean stop: no verdict).

A step's files are taken as durable when it starts (time passed since the last one).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agent_fsm.actions import operations
from agent_fsm.actions.recover import recover
from agent_fsm.actions.upgrade import begin_upgrade
from agent_fsm.agent import daemon as daemon_mod
from agent_fsm.agent import judge as judge_mod
from agent_fsm.agent import publishing
from agent_fsm.agent.runtime import Waker
from agent_fsm.agent.start_check import ALLOW, start_check
from agent_fsm.errors import AgentFsmError, LockTimeout
from agent_fsm.node.config import Config
from agent_fsm.node.releases.pointers import Releases
from agent_fsm.node.state import journal as journal_mod
from agent_fsm.node.state import lock as lock_mod
from agent_fsm.node.state import reasons
from agent_fsm.system.notify import Notifier
from agent_fsm.testing import FakeClock, FakePublisher
from agent_fsm.upgrade.roles import Command
from agent_fsm.wiring import Node, open_node
from tests.reliability import powerloss

from .tree import Tree
from .units import ModelSystemd, Units


class Killed(BaseException):
    """The process got SIGKILL (or the power went out) at a kill point: nothing catches it."""


@dataclass(frozen=True)
class Fault:
    kind: str  # crash, power, power-op, enospc, systemctl, lock, publisher, candidate, clock
    at: int | str | None = None

    def __str__(self) -> str:
        return self.kind if self.at is None else f"{self.kind} {self.at}"


@dataclass(frozen=True)
class Process:
    """Which process runs: `start` (the agent unit's start: ExecStartPre, then ExecStart
    resolves `selected`), `daemon` (the exec'd release's daemon), `poll` (the serving daemon's
    look for an operator's command that died), `recovery` (the recovery unit's `recover`), or
    an operator's `upgrade V`, `install V`, `activate V`, `recover`, `add V` (`release add` of
    V's directory), `prune` (`release prune --keep 0`), `follow A` (`follow --no-wait`, the
    server giving answer A of `channel.ANSWERS`)."""

    kind: str
    version: str | None = None

    def __str__(self) -> str:
        return self.kind if self.version is None else f"{self.kind} {self.version}"


@dataclass
class Ran:
    """What one step did, for the search, the invariants and the timeline."""

    who: str  # the process, in words, with the release whose code ran
    code: str | None  # the release whose code ran (None: an operator's, or no code ran)
    fired: list[dict[str, Any]] = field(default_factory=list)  # history entries recorded
    end: str = ""  # how the process ended
    units: Units = field(default_factory=Units)
    tree: Tree | None = None
    # What the fault-free run used, to enumerate the faults that can hit it
    kill_points: int = 0
    writes: int = 0
    file_ops: int = 0
    verbs: frozenset[str] = frozenset()
    locked: bool = False
    published: bool = False
    judged: bool = False
    died: bool = False  # killed, timed out, or its workload died: the candidate crashed
    refused: bool = False  # the start check refused a candidate's start
    unit_failed: bool = False  # the agent unit failed (systemd's Result= is not success)
    last_good_before: str | None = None
    calls: list[tuple[str, str]] = field(default_factory=list)


class ModelWaker(Waker):
    """The daemon's waker: no signal handlers; `stop` is set when systemd stops the unit (a
    restart of it); a wait returns at once, moving the process's clock on."""

    def __init__(self, clock: FakeClock) -> None:
        self.stop = False
        self.child = False
        self.clock = clock

    def wait(self, timeout: float | None, also: int | None = None) -> None:
        if not self.stop:
            self.clock.advance(timeout if timeout is not None else 3600.0)


@dataclass(frozen=True)
class Host:
    """What every step shares: the work directory, the config, the releases, the rendering."""

    root: Path
    config: Config
    versions: tuple[str, ...]
    agent_unit: str
    recovery_unit: str
    agent_unit_rel: str  # the agent unit file, relative to root
    gate_dir_rel: str
    sources: Path | None = None  # the release directories `release add` takes (outside root)
    channel: Any = None  # `channel.Channel`, when the operator's commands include `follow`


def _node(host: Host, sd: ModelSystemd, publisher: FakePublisher, clock: FakeClock,
          command: Command | None = None, release: str | None = None) -> Node:
    return open_node(host.config, host.root, systemd=sd, publisher=publisher, clock=clock,
                     command=command, release=release)


class Run:
    """One step in progress: its instruments (kill points, writes, the lock) and its fault."""

    def __init__(self, host: Host, fault: Fault | None, mp: pytest.MonkeyPatch,
                 store: bool = False) -> None:
        self.host = host
        self.fault = fault
        self.kills = 0
        self.writes = 0
        self.locked = False
        self.judged = False
        self.fired: list[dict[str, Any]] = []
        self.power: powerloss.PowerLoss | None = None
        if store:  # the store's own file operations are its kill points; a cut one is dead
            cut = fault is not None and fault.kind in ("crash-op", "power-op")
            at = int(fault.at or 0) if cut and fault is not None else None
            self.power = powerloss.PowerLoss(host.root, crash_at=at,
                                             ops_counted=powerloss.STORE_OPS, dies=True)
            self.power.install(mp)
        elif fault is not None and fault.kind in ("power", "power-op"):
            self.power = powerloss.PowerLoss(host.root, crash_at=fault.at if fault.kind == "power-op"
                                             else None)  # type: ignore[arg-type]
            self.power.install(mp)
        elif os.environ.get("AGENT_FSM_MODELCHECK_COUNT_OPS"):
            self.power = powerloss.PowerLoss(host.root)
            self.power.install(mp)
        real_write = os.write

        def write(fd: int, data: Any) -> int:
            self.writes += 1
            if fault is not None and fault.kind == "enospc" and self.writes >= int(fault.at or 0):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real_write(fd, data)

        mp.setattr(os, "write", write)
        real_append = journal_mod.Journal.append

        def append(journal: journal_mod.Journal, entry: dict[str, Any], limit: int) -> None:
            real_append(journal, entry, limit)
            self.kill_point()

        mp.setattr(journal_mod.Journal, "append", append)
        real_held = lock_mod.held

        @contextlib.contextmanager
        def held(path: Path, timeout: float, mode: int = 0o600,
                 stopping: Callable[[], bool] | None = None) -> Iterator[None]:
            self.locked = True
            if fault is not None and fault.kind == "lock":
                raise LockTimeout(str(path))
            with real_held(path, timeout, mode, stopping):
                yield

        mp.setattr(lock_mod, "held", held)

    def kill_point(self) -> None:
        self.kills += 1
        if self.fault is not None and self.fault.kind in ("crash", "power") \
                and self.kills == self.fault.at:
            raise Killed(str(self.fault))

    def watch(self, node: Node) -> Node:
        """Count the engine's failpoints as kill points; keep what the process records."""
        node.controller.failpoint = lambda _t, _k: self.kill_point()
        record = node.store.record

        def recorded(doc: Any, entry: dict[str, Any], limit: int) -> None:
            record(doc, entry, limit)
            self.fired.append(dict(entry))

        node.store.record = recorded  # type: ignore[method-assign]
        return node


def run(host: Host, tree: Tree, units: Units, clock_t: float, process: Process,
        fault: Fault | None, candidate: str | None) -> Ran:
    """Run `process` on `tree` with at most one `fault`; `candidate`: the version the signal
    names (whose daemon the candidate behaviours apply to)."""
    tree.put(host.root)
    clock = FakeClock(t=clock_t)
    fails = 0 if fault is None or fault.kind != "publisher" else 10**9 if fault.at == "dead" else 1
    publisher = FakePublisher(failures=fails)
    sd = ModelSystemd(units, host.agent_unit,
                      fail=frozenset({str(fault.at)}) if fault is not None
                      and fault.kind == "systemctl" else frozenset(),
                      recovery_unit=host.recovery_unit, unit_file=lambda: _unit_file(host))
    releases = Releases(_node(host, sd, publisher, clock).paths)
    ran = Ran(who=str(process), code=None, units=units, last_good_before=releases.last_good())
    if process.kind == "daemon":
        ran.code = units.running
        ran.who = f"daemon of {units.running}"
    with pytest.MonkeyPatch.context() as mp:
        r = Run(host, fault, mp, store=process.kind in STORE_COMMANDS)
        try:
            if fault is not None and fault.kind == "crash" and fault.at == 0:
                raise Killed("before it did anything")  # a crash at import, say
            body = BODIES[process.kind]
            body(host, r, ran, sd, publisher, clock, process, fault, candidate)
        except (Killed, powerloss.Crash):
            ran.died = True
            ran.end = f"killed ({fault})"
            _ended_badly(host, ran, sd, process)
        if r.power is not None:
            r.power.crash_at = None  # the process is gone: putting the disk back is not it
        ran.kill_points, ran.writes, ran.locked = r.kills, r.writes, r.locked
        ran.file_ops = r.power.ops if r.power is not None else 0
        ran.judged = r.judged
        if r.power is not None and fault is not None and fault.kind in ("power", "power-op"):
            r.power.lose_power()
    ran.verbs = frozenset(sd.used)
    ran.published = publisher.attempts > 0
    ran.fired = r.fired
    ran.calls = list(sd.calls)
    if fault is not None and fault.kind in ("power", "power-op"):
        ran.units = units.boot(_unit_file(host))
        ran.end += "; the host boots"
    if ran.units.running is None:  # systemd removes the RuntimeDirectory= with the process
        shutil.rmtree(host.root / host.gate_dir_rel, ignore_errors=True)
    ran.tree = Tree.take(host.root)
    return ran


def _ended_badly(host: Host, ran: Ran, sd: ModelSystemd, process: Process) -> None:
    """What systemd does when the step's process failed (exit 1, killed, timed out)."""
    units = ran.units.apply(sd.calls, host.agent_unit, host.recovery_unit, _unit_file(host))
    agents = ("start", "daemon", "poll")  # the agent unit's process (`poll`: the serving one)
    if process.kind in agents and units.agent.startswith("stopping:"):
        units = units.start_agent()  # the restart job goes on: a stop, not a failure
    elif process.kind in agents:
        ran.unit_failed = not sd.stop
        units = units if sd.stop else units.agent_failed()
    elif process.kind == "recovery":
        units = units.recovery_failed()
    ran.units = units


def _ended(host: Host, ran: Ran, sd: ModelSystemd) -> Units:
    return ran.units.apply(sd.calls, host.agent_unit, host.recovery_unit, _unit_file(host))


def _unit_file(host: Host) -> bytes | None:
    try:
        return (host.root / host.agent_unit_rel).read_bytes()
    except OSError:
        return None


def _failed(exc: BaseException) -> str:
    if isinstance(exc, AgentFsmError):
        return f"exit 1: {exc}"
    return "exit 1: traceback: " + "".join(traceback.format_exception_only(exc)).strip()


Body = Callable[[Host, Run, Ran, ModelSystemd, FakePublisher, FakeClock, Process, "Fault | None",
                 "str | None"], None]


def _start(host: Host, r: Run, ran: Ran, sd: ModelSystemd, publisher: FakePublisher,
           clock: FakeClock, process: Process, fault: Fault | None, candidate: str | None) -> None:
    """The agent unit starts: RuntimeDirectory= made, ExecStartPre= (the last-good's start
    check, counting a candidate's starts), then ExecStart= resolves `selected`."""
    node = r.watch(_node(host, sd, publisher, clock))
    ran.units = ran.units.counted_start()
    if ran.units.start_refused:  # systemd's start limit, before anything of the unit runs
        ran.who = f"systemd starts {host.agent_unit}: past its start limit"
        ran.end = ("refused: start request repeated too quickly (result start-limit-hit); "
                   "OnFailure= starts the recovery unit")
        ran.unit_failed = True
        ran.units = ran.units.start_limit_hit()
        return None
    (host.root / host.gate_dir_rel).mkdir(parents=True, exist_ok=True)
    last_good = node.releases.last_good()
    ran.who = f"systemd starts {host.agent_unit}: start-check of {last_good}"
    if last_good is None:
        ran.end = "ExecStartPre= failed: no last-good release to run it"
        return _ended_badly(host, ran, sd, process)
    try:  # as start_check.main: whatever fails unexpectedly lets the start go on
        code = start_check(node, sd)
    except Exception as exc:
        ran.end = f"start check failed ({type(exc).__name__}: {exc}); the start goes on"
        code = ALLOW
    if code != ALLOW:
        ran.refused = True
        ran.end = "start refused (exit 1)"
        return _ended_badly(host, ran, sd, process)
    try:
        selected = node.releases.selected()
    except (AgentFsmError, OSError) as exc:
        selected = None
        ran.end = f"ExecStart= cannot resolve selected: {exc}"
    if selected is None:
        ran.end = ran.end or "ExecStart= failed: nothing selected"
        return _ended_badly(host, ran, sd, process)
    ran.units = replace(_ended(host, ran, sd), agent=f"exec:{selected}")
    ran.end = (ran.end + "; " if ran.end else "") + f"ExecStart= runs release {selected}"
    return None


def _daemon(host: Host, r: Run, ran: Ran, sd: ModelSystemd, publisher: FakePublisher,
            clock: FakeClock, process: Process, fault: Fault | None,
            candidate: str | None) -> None:
    release = ran.units.running
    assert release is not None
    ran.code = release
    node = r.watch(_node(host, sd, publisher, clock, Command.daemon, release))
    mine = FakeClock(t=clock.t)  # the process's own clocks: sleeps end at once
    waker = ModelWaker(mine)
    sd.own_unit, sd.waker = host.agent_unit, waker
    stopping = ran.units.agent.startswith("stopping:")
    waker.stop = stopping  # SIGTERM already came: the handler set the flag
    d = daemon_mod.Daemon(node, Notifier(""), waker)
    d.clock = mine  # type: ignore[assignment]
    try:  # its role as it starts, for the timeline
        role = node.controller.process.role(node.store.read()) if node.controller.process else None
        ran.who = f"daemon of {release} ({(role or 'no role').replace('_', '-')})"
    except AgentFsmError:
        ran.who = f"daemon of {release} (its state file does not read)"
    behaviour = str(fault.at) if fault is not None and fault.kind == "candidate" else "ok"

    def check(_argv: Any, _env: Any, _timeout: float) -> tuple[bool, str]:
        r.judged = True
        if behaviour in ("hang", "stop"):
            waker.stop = True  # TimeoutStartSec= passed, or a reboot: systemd stops the start
            return False, "stopped while the check ran"
        return (behaviour != "checks", "model check: " + ("passed" if behaviour != "checks"
                                                          else "failed"))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(judge_mod, "run_check", check)
        mp.setattr(daemon_mod, "time", SimpleNamespace(monotonic=mine.monotonic))
        defaults = publishing.open_gate_after_judgment.__kwdefaults__
        assert defaults is not None
        mp.setitem(defaults, "monotonic", mine.monotonic)
        if behaviour == "crash":
            mp.setattr(d.workload, "alive", lambda: False)
        sd.stop.clear()
        waker_stop = sd.stop
        try:
            ok = d.startup()
        except AgentFsmError as exc:
            ok = False
            ran.end = _failed(exc)
        except Exception as exc:
            ok = False
            ran.end = _failed(exc)
    units = _ended(host, ran, sd)
    if stopping:  # the restart that stopped it starts the unit again
        ran.units = units.start_agent() if units.agent.startswith("stopping:") else units
        ran.end = (ran.end or "exit") + "; stopped by the restart queued while it started"
    elif waker_stop:  # its unit was restarted: stopped, not failed
        ran.units = units
        ran.end = ran.end or "stopped by the restart of its unit"
    elif behaviour == "stop" and r.judged:
        ran.units = units.boot(_unit_file(host))  # a reboot during the judgment: a clean stop
        ran.end = (ran.end or "exit 0") + "; the host reboots"
    elif behaviour == "hang" and r.judged:
        ran.died = True
        ran.units = units
        ran.end = "start timeout: stopped, the unit failed"
        _ended_badly(host, ran, SimpleNamespace(calls=[], stop=[]), process)  # type: ignore[arg-type]
    elif ok:
        ran.units = replace(units, agent=f"active:{release}")
        ran.end = "READY=1"
    else:
        ran.died = ran.died or behaviour == "crash"
        ran.end = ran.end or "exit 1"
        ran.units = units
        _ended_badly(host, ran, SimpleNamespace(calls=[], stop=[]), process)  # type: ignore[arg-type]


def _recovery(host: Host, r: Run, ran: Ran, sd: ModelSystemd, publisher: FakePublisher,
              clock: FakeClock, process: Process, fault: Fault | None,
              candidate: str | None) -> None:
    """The recovery unit: its script execs the last-good's `agent-fsm recover`."""
    last_good = ran.last_good_before
    ran.who = f"recovery unit: recover of {last_good}"
    if last_good is None:
        ran.end = "the script found no last-good release"
        return _ended_badly(host, ran, sd, process)
    ran.code = last_good
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(reasons.RECOVERY_ENV, "unit")
        try:
            node = r.watch(_node(host, sd, publisher, clock, Command.recover, last_good))
            done = recover(node, by_unit=True)
        except (AgentFsmError, Exception) as exc:
            ran.end = _failed(exc)
            return _ended_badly(host, ran, sd, process)
    ran.units = replace(_ended(host, ran, sd), recovery="inactive")
    ran.end = f"exit 0: {done.message}"
    return None


def _operator(host: Host, r: Run, ran: Ran, sd: ModelSystemd, publisher: FakePublisher,
              clock: FakeClock, process: Process, fault: Fault | None,
              candidate: str | None) -> None:
    """An operator's command; `recover` runs the last-good's own binary (the CLI hands over)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(reasons.RECOVERY_ENV, raising=False)
        try:
            if process.kind == "recover":
                last_good = ran.last_good_before
                ran.code = last_good
                ran.who = f"operator: agent-fsm recover (of {last_good})"
                node = r.watch(_node(host, sd, publisher, clock, Command.recover, last_good))
                done = recover(node).message
            else:
                ran.who = f"operator: agent-fsm {process}"
                node = r.watch(_node(host, sd, publisher, clock, Command.operator))
                version = str(process.version)
                if process.kind == "upgrade":
                    done = f"upgrade to {begin_upgrade(node, version).state}"
                elif process.kind == "install":
                    done = operations.install(node, version).message
                else:
                    done = operations.activate(node, version).message
            ran.end = f"exit 0: {done}"
        except (AgentFsmError, Exception) as exc:
            ran.end = _failed(exc)
    ran.units = _ended(host, ran, sd)


def _release(host: Host, r: Run, ran: Ran, sd: ModelSystemd, publisher: FakePublisher,
             clock: FakeClock, process: Process, fault: Fault | None,
             candidate: str | None) -> None:
    """An operator's `release add DIR` (what the CLI's `add_from` runs: `sources.add_source`,
    DIR the release directory packed for V outside the node's root) or `release prune
    --keep 0` (`pruning.prune`: every release not protected removed, staged ones too)."""
    from agent_fsm.actions.releases import pruning, sources

    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(reasons.RECOVERY_ENV, raising=False)
        try:
            node = r.watch(_node(host, sd, publisher, clock, Command.operator))
            if process.kind == "add":
                assert host.sources is not None
                ran.who = f"operator: agent-fsm release add {process.version}"
                added = sources.add_source(str(source_dir(host.sources, str(process.version))),
                                           node)
                done = f"release {added.version} " + ("already stored" if added.already
                                                      and not added.replaced else "stored")
            else:
                ran.who = "operator: agent-fsm release prune --keep 0"
                pruned = pruning.prune(node, keep=0)
                done = f"removed {', '.join(pruned.removed) or 'nothing'}"
            ran.end = f"exit 0: {done}"
        except (AgentFsmError, Exception) as exc:
            ran.end = _failed(exc)
    ran.units = _ended(host, ran, sd)


def source_dir(sources: Path, version: str) -> Path:
    """Release `version`'s directory, as `release pack` would leave it for `release add`."""
    return sources / f"rel-{version}"


STORE_COMMANDS = ("add", "prune")


def _follow(host: Host, r: Run, ran: Ran, sd: ModelSystemd, publisher: FakePublisher,
            clock: FakeClock, process: Process, fault: Fault | None,
            candidate: str | None) -> None:
    """An operator's `agent-fsm follow --no-wait` (`channel.run`), the server's answer
    `process.version`."""
    from . import channel

    record = host.root / host.channel.record_rel
    seen = channel.seen_in(record.read_bytes() if record.exists() else None)
    ran.who = channel.who(str(process.version), None if seen is None else seen[0])
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(reasons.RECOVERY_ENV, raising=False)
        try:
            node = r.watch(open_node(host.channel.config, host.root, systemd=sd,
                                     publisher=publisher, clock=clock, command=Command.operator))
            ran.end = "exit 0: " + channel.run(host.channel, node, clock, str(process.version))
        except (AgentFsmError, Exception) as exc:
            ran.end = _failed(exc)
    ran.units = _ended(host, ran, sd)


def _poll(host: Host, r: Run, ran: Ran, sd: ModelSystemd, publisher: FakePublisher,
          clock: FakeClock, process: Process, fault: Fault | None, candidate: str | None) -> None:
    """The serving daemon's loop looks (`DeadCommand.finish`): work a command that
    died left, the writers' lock free: the last-good finishes it in place, or it restarts its
    own unit for another release's start."""
    release = ran.units.running
    assert release is not None
    ran.code = release
    ran.who = f"daemon of {release} (serving): its look for a command that died"
    node = r.watch(_node(host, sd, publisher, clock, Command.daemon, release))
    waker = ModelWaker(FakeClock(t=clock.t))
    sd.own_unit, sd.waker = host.agent_unit, waker
    d = daemon_mod.Daemon(node, Notifier(""), waker)
    try:
        done = d.dead_command.finish()
        ran.end = ("nothing to do" if not done else "finished in place"
                   if d.dead_command.restart_asked_at is None else "restart of its unit queued")
    except Exception as exc:  # a traceback: the serving daemon dies of it
        ran.end = _failed(exc)
        return _ended_badly(host, ran, sd, process)
    ran.units = _ended(host, ran, sd)
    return None


BODIES: dict[str, Body] = {
    "start": _start, "daemon": _daemon, "recovery": _recovery, "poll": _poll,
    "upgrade": _operator, "install": _operator, "activate": _operator, "recover": _operator,
    "add": _release, "prune": _release, "follow": _follow,
}


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """The processes log as the daemon does; the check keeps only what it renders. The logger
    is given back as it was (a test after the check in the same process reads its logs)."""
    log = logging.getLogger("agent_fsm")
    level, propagate = log.level, log.propagate
    log.setLevel(logging.CRITICAL + 1)
    log.propagate = False
    try:
        yield
    finally:
        log.setLevel(level)
        log.propagate = propagate
