"""`make bench`: agent-fsm's figures, each as a ratio to a floor measured in the same run.

Every figure is the median of a few runs, divided by a floor: the cost of the same job done by
the simplest thing that could do it on this machine (a bare `systemctl restart` of the same
daemon, one durable write of the same bytes, a bare `python -c pass`...). Ratios travel between
machines better than seconds. Results go to a rich table on the terminal, to
`bench/results.json` (a list of objects: name, value, floor, ratio, target, unit, passed,
samples, details) and to a small SVG chart of the ratios against their targets,
`bench/ratios.svg`. No test asserts on
these numbers; see docs/benchmarks.md for what each one means and for the latest figures.

The systemd figures run in a private systemd (`SystemdSandbox`) driven by `Lab`, one sandbox per
figure so that each has its own judgment settings; the others run on the host, in a temporary
directory on the real disk (not a tmpfs: the fsyncs must reach a disk).

    python -m bench.run [--repeat N] [--only NAME ...] [--output FILE] [--strict]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_fsm import files
from agent_fsm.actions.releases import abi, packing
from agent_fsm.machine.engine import Controller
from agent_fsm.node import config as config_mod
from agent_fsm.node.config import Config
from agent_fsm.node.paths import Paths
from agent_fsm.node.state.store import Store
from agent_fsm.system.clock import SystemClock
from agent_fsm.testing import FakePublisher, FakeSystemd
from agent_fsm.upgrade.effectors import Effectors
from agent_fsm.upgrade.registry import CONDITIONS, EFFECTS, load_definition
from agent_fsm.wiring import Node, open_node
from agent_fsm_lab.lab import RECOVERY_UNIT, UNIT, Kind, Lab
from agent_fsm_lab.sandbox import SystemdSandbox, missing_requirements, python_paths

from . import big, wayback

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = REPO / "bench" / "results.json"
DEFAULT_CHART = REPO / "bench" / "ratios.svg"
# On the real disk on this project's machines (ext4); /tmp may be a tmpfs elsewhere.
WORK_BASE = Path("/var/tmp")

# Judgment settings of the systemd figures (see docs/benchmarks.md for why these).
GOOD = {"deadline": 6.0, "soak": 1.0, "max_attempts": 2, "restart": 1.0}
# Never judged: it exits before. Only the start limit (max_attempts) and the wait before each
# restart (restart_seconds, RestartSec=) matter: max_attempts of those waits are policy.
CRASH = GOOD
UNHEALTHY = {"deadline": 2.0, "soak": 0.0, "max_attempts": 2, "restart": 1.0}
IDLE_SETTLE = 10.0  # seconds idle before the first reading
IDLE_INTERVALS = (5.0, 5.0, 5.0)  # then readings this far apart
STARTS = 5  # restarts of each idle node, after its readings (`daemon_start_files`)

RSS_FLOOR_MB = 20.0  # a fixed budget: an interpreter with what the daemon needs, no CLI
WAKEUPS_FLOOR = 1.0  # per second; the target ratio is 0: an idle daemon never wakes up

# The floor of `daemon_start_to_ready`: the simplest Type=notify service in Python, started by the
# same interpreter the same way (`-I -S -B`) as a release's bin/agent-fsm starts the daemon.
NOTIFY_FLOOR_UNIT = "notify-floor.service"
NOTIFY_FLOOR_SCRIPT = """\
import os, signal, socket
address = os.environ["NOTIFY_SOCKET"]
if address.startswith("@"):
    address = "\\0" + address[1:]
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
    sock.sendto(b"READY=1", address)
signal.pause()
"""

# A machine of two states and two effect-free transitions: what `durable_transition` fires.
FLIP_FLOP = """\
[machine]
name = "flip-flop"
initial = "a"

[states.a]
description = "One side."
on_start = "converge_then_open_gate"
on_recover = "nothing_pending"

[states.b]
description = "The other side."
on_start = "converge_then_open_gate"
on_recover = "nothing_pending"

[[transitions]]
trigger = "flip"
source = "a"
dest = "b"
by = ["operator"]

[[transitions]]
trigger = "flop"
source = "b"
dest = "a"
by = ["operator"]
"""

UPGRADE_CYCLE = (
    ("begin_upgrade", "converged", "candidate_running"),
    ("candidate_started", "candidate_running", "candidate_running"),
    ("judge_ok", "candidate_running", "judged_ok"),
    ("complete", "judged_ok", "converged"),
)

# upgrades: daemon_start_to_ready; wayback: rollback_big, daemon_start_big
GROUPS = ("durable", "status", "releases", "big", "upgrades", "wayback", "idle")
RESTART = "`systemctl restart agent.service` of a good release until READY=1"
# name: (group, what the value is, what the floor is, unit, target ratio)
SPECS: dict[str, tuple[str, str, str, str, float]] = {
    "durable_transition": (
        "durable", "Controller.fire of an effect-free transition, its state writes included",
        "files.atomic_write of the same bytes: temp write, fsync, rename, directory fsync",
        "ms", 3.0),
    "status_json": (
        "status", "`agent-fsm status --json` of a converged node, history at the default limit",
        "`python -c pass` with the same interpreter", "ms", 5.0),
    "status_json_long_history": (
        "status", "`status --json` with 10,000 entries of history (history_limit = 10000)",
        "`status --json` with 10 entries, same config", "ms", 1.2),
    "release_pack": (
        "releases", "`release pack` of this agent-fsm (copy, vendor, byte-compile the fast path, "
        "python.toml)", "`cp -a` of the packed release's tree", "s", 3.0),
    "release_add": (
        "releases", "`release add` of a packed release into a store that holds none of its files "
        "(copied, every file fsynced, digested, checked)", "`cp -a` of the same tree", "s", 5.0),
    "release_add_next": (
        "releases", "`release add` of the next version (its own launcher and payload) into a "
        "store holding the previous one: the shared files hashed and linked, not copied",
        "`cp -a` of the same tree", "s", 2.0),
    "store_ten_releases": (
        "releases", "disk used by a store of ten releases (ten versions, each its own small "
        "payload), each file counted once as `du` counts", "the same store holding one of them",
        "MB", 2.0),
    "release_pack_runtime": (
        "big", "`release pack --payload` of a Node.js-sized agent: the runtime binary (98 MB), "
        "52 MB beside it, 20,000 files of 200 bytes", "`cp -a` of the same payload", "s", 3.0),
    "release_add_runtime": (
        "big", "`release add` of that release into an empty store (its copy synced)",
        "`cp -a` of the packed release, then `sync`", "s", 2.0),
    "release_pack_tree_1g": (
        "big", "`release pack --payload` of a 1 GiB tree (eight files of random bytes)",
        "`cp -a` of the same payload", "s", 3.0),
    "release_add_tree_1g": (
        "big", "`release add` of that release into an empty store (its copy synced)",
        "`cp -a` of the packed release, then `sync`", "s", 2.0),
    "store_two_versions": (
        "big", "disk used by a store holding two versions of the Node.js-sized agent that differ "
        "in one small payload file, each file counted once as `du` counts",
        "the same store holding the first alone", "MB", 1.2),
    "release_add_peak_rss": (
        "big", "peak RSS of a process adding the 1 GiB release", "a fixed budget", "MB", 1.0),
    "good_upgrade": (
        "upgrades", "`upgrade --wait` to a good candidate until READY=1, minus the soak",
        RESTART, "s", 1.8),
    "rollback_crash_at_start": (
        "upgrades", "`upgrade --wait` to a candidate that crashes at start until the last-good "
        "is READY, gate open, signal cleared, minus the configured waits before each restart "
        "(max_attempts times restart_seconds: policy, like the deadline)", RESTART, "s", 5.0),
    "rollback_failed_health": (
        "upgrades", "the same for a candidate whose health check fails, minus the configured "
        "deadline (policy: no judge may call a check failed before it)", RESTART, "s", 2.5),
    "daemon_start_to_ready": (
        "upgrades", "`systemctl restart agent.service` of a converged agent until READY=1",
        "`systemctl restart` of a bare-Python Type=notify service (same interpreter, -I -S -B) "
        "until READY=1", "s", 1.5),
    "rollback_big": (
        "wayback", "`upgrade --wait` to a candidate that crashes at start, back to a last-good "
        "with a 1 GiB payload, minus the restart waits (as `rollback_crash_at_start`)",
        "the same rollback to a last-good with a 1 KiB payload", "s", 1.2),
    "daemon_start_big": (
        "wayback", "`systemctl restart agent.service` to READY=1 of a last-good with a 1 GiB "
        "payload", "the same with a 1 KiB payload", "s", 1.2),
    "daemon_idle_rss": (
        "idle", "the daemon's VmRSS after 10 s idle", "a fixed budget", "MB", 1.0),
    "daemon_idle_wakeups": (
        "idle", "the daemon's voluntary context switches per second while idle, no watchdog",
        "one per second (the target is none at all)", "/s", 0.0),
    "daemon_start_files": (
        "idle", "`systemctl restart agent.service` to READY=1, the release carrying 20,000 small "
        "files", "the same restart with the lab's small release (~1,000 files)", "s", 1.2),
    "daemon_idle_rss_files": (
        "idle", "the daemon's VmRSS after 10 s idle, its release carrying 20,000 small files",
        "`daemon_idle_rss` (the same daemon, a release of ~1,000 files)", "MB", 1.2),
}


class BenchError(RuntimeError):
    """A benchmark could not run as intended (the node did not end where it should)."""


@dataclass
class Figure:
    name: str
    what: str
    floor_what: str
    unit: str
    target: float
    samples: list[float] = field(default_factory=list)
    floor_samples: list[float] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None

    @property
    def value(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None

    @property
    def floor(self) -> float | None:
        return statistics.median(self.floor_samples) if self.floor_samples else None

    @property
    def ratio(self) -> float | None:
        if self.value is None or not self.floor:
            return None
        return self.value / self.floor

    @property
    def passed(self) -> bool | None:
        return None if self.ratio is None else self.ratio <= self.target

    def to_json(self) -> dict[str, Any]:
        def rounded(x: float | None) -> float | None:
            return None if x is None else round(x, 4)

        return {
            "name": self.name,
            "value": rounded(self.value),
            "floor": rounded(self.floor),
            "ratio": rounded(self.ratio),
            "target": self.target,
            "unit": self.unit,
            "passed": self.passed,
            "what": self.what,
            "floor_what": self.floor_what,
            "samples": [round(s, 4) for s in self.samples],
            "floor_samples": [round(s, 4) for s in self.floor_samples],
            "details": self.details,
            **({"skipped": self.skipped} if self.skipped else {}),
        }


def figure(name: str, samples: list[float] | None = None,
           floor_samples: list[float] | None = None, details: dict[str, Any] | None = None,
           skipped: str | None = None) -> Figure:
    _, what, floor_what, unit, target = SPECS[name]
    return Figure(name, what, floor_what, unit, target, samples or [], floor_samples or [],
                  details or {}, skipped)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# Where things run -------------------------------------------------------------------------------
def filesystem_of(path: Path) -> str:
    """`fstype (source) at mountpoint` of the mount holding `path`."""
    best, found = "", "unknown"
    target = str(path.resolve())
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        mount = fields[4].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, found = mount, f"{fields[sep + 1]} ({fields[sep + 2]}) at {mount}"
    return found


# durable_transition ------------------------------------------------------------------------------
@dataclass
class DurableRun:
    transition_ms: list[float] = field(default_factory=list)
    write_ms: list[float] = field(default_factory=list)
    transition_cpu_ms: list[float] = field(default_factory=list)
    write_cpu_ms: list[float] = field(default_factory=list)
    state_file_bytes: int = 0
    history_entries: int = 0
    warmup: int = 0


def durable_run(root: Path, history_limit: int, repeat: int, per_sample: int) -> DurableRun:
    """Fire effect-free transitions (history at `history_limit`), and durable writes of the
    state file's bytes to a sibling file, interleaved; milliseconds per operation."""
    config = Config(name="bench", state_dir=root / "state", lib_dir=root / "lib",
                    unit_dir=root / "units", run_dir=Path("/run/agent-fsm-bench"),
                    history_limit=history_limit)
    paths = Paths(config)
    definition = load_definition(FLIP_FLOP, "bench flip-flop")
    store = Store(paths.state_file, paths.lock_file, definition.state_names, definition.initial)
    effectors = Effectors(paths, FakeSystemd(), FakePublisher(), SystemClock())
    controller = Controller(definition, store, effectors, effects=EFFECTS, conditions=CONDITIONS,
                            history_limit=history_limit)
    next_trigger = {"a": "flip", "b": "flop"}
    state = "a"

    def fire(n: int) -> None:
        nonlocal state
        for _ in range(n):
            state = controller.fire(next_trigger[state]).state

    run = DurableRun(warmup=history_limit + 100)
    fire(run.warmup)  # the steady state of a node in service: its history at the limit
    run.history_entries = len(_history_of(store))
    data = paths.state_file.read_bytes()
    run.state_file_bytes = len(data)
    floor_path = paths.state_file.with_name("floor.json")
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fire(per_sample)
        run.transition_ms.append((time.perf_counter() - t0) / per_sample * 1000)
        run.transition_cpu_ms.append((time.process_time() - c0) / per_sample * 1000)
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(per_sample):
            files.atomic_write(floor_path, data)
        run.write_ms.append((time.perf_counter() - t0) / per_sample * 1000)
        run.write_cpu_ms.append((time.process_time() - c0) / per_sample * 1000)
    return run


def durable_transition(workdir: Path, repeat: int, per_sample: int = 40) -> Figure:
    """One effect-free transition (lock, read, write-ahead, final record) vs one durable write."""
    steady = durable_run(workdir / "durable", Config().history_limit, repeat, per_sample)
    fresh = durable_run(workdir / "durable-10", 10, repeat, per_sample)

    def med(xs: list[float]) -> float:
        return round(statistics.median(xs), 3)

    state_dir = workdir / "durable" / "state"
    ratios = sorted(t / w for t, w in zip(steady.transition_ms, steady.write_ms, strict=True))
    return figure(
        "durable_transition", steady.transition_ms, steady.write_ms,
        {
            "ratio_min_median_max": [round(ratios[0], 2), round(statistics.median(ratios), 2),
                                     round(ratios[-1], 2)],
            "directory": str(state_dir),
            "filesystem": filesystem_of(state_dir),
            "history_entries": f"{steady.history_entries} (the default history_limit) after "
                               f"{steady.warmup} transitions",
            "state_file_bytes": steady.state_file_bytes,
            "operations_per_sample": per_sample,
            # The state file's durable write, and the journal's line fsynced with it.
            "writes_per_transition": 1,
            "journal_fsync_every": 1,
            "cpu_ms": {"transition": med(steady.transition_cpu_ms),
                       "write": med(steady.write_cpu_ms)},
            "with_10_history_entries": {
                "transition_ms": med(fresh.transition_ms), "write_ms": med(fresh.write_ms),
                "ratio": round(statistics.median(fresh.transition_ms)
                               / statistics.median(fresh.write_ms), 2),
                "state_file_bytes": fresh.state_file_bytes,
                "cpu_ms": {"transition": med(fresh.transition_cpu_ms),
                           "write": med(fresh.write_cpu_ms)}},
        },
    )


# status_json, status_json_long_history -----------------------------------------------------------
def _history(n: int, t_end: float) -> list[dict[str, Any]]:
    """`n` history entries as a node that went through n/4 good upgrades would have them."""
    entries = []
    for i in range(n):
        trigger, source, dest = UPGRADE_CYCLE[i % 4]
        k = i // 4
        entries.append({"time": t_end - n + i, "trigger": trigger, "from": source, "to": dest,
                        "release": None, "upgrade": {"from": f"1.{k}.0", "to": f"1.{k + 1}.0"}})
    return entries


def make_status_node(root: Path, entries: int, history_limit: int | None) -> Path:
    """A node below `root` (used with --root): installed, one good upgrade, `entries` of history.

    Built in-process through the real controller with systemd and the publisher faked (no
    systemd is touched), then its history padded to `entries` through the store, so the state
    file is exactly what agent-fsm itself writes. Returns its config file.
    """
    cfg = root / "config.toml"
    root.mkdir(parents=True)
    cfg.write_text('name = "agent"\n'
                   + (f"history_limit = {history_limit}\n" if history_limit else ""))
    node = open_node(config_mod.load(cfg), root, systemd=FakeSystemd(), publisher=FakePublisher())
    # The node's interpreter as seen below --root (adding a release checks it can run it): the
    # one that packs them here.
    python = node.paths.real(node.config.python)
    python.parent.mkdir(parents=True, exist_ok=True)
    python.symlink_to(sys.executable)
    for version in ("1.0.0", "2.0.0"):
        packing.add(packing.pack(version, root / "packs" / version), node)
    node.paths.gate_file.parent.mkdir(parents=True, exist_ok=True)  # systemd's RuntimeDirectory=
    c = node.controller
    c.fire("install", release="1.0.0")
    c.fire("settle")  # what the daemon does at start: opens the gate
    for trigger in ("begin_upgrade", "candidate_started", "judge_ok", "complete"):
        c.fire(trigger, **({"release": "2.0.0"} if trigger == "begin_upgrade" else {}))
    with node.store.locked():
        doc = node.store.read()
        real = _history_of(node.store)
        padded = (_history(entries, real[0]["time"]) + real)[-entries:]
        journal = getattr(node.store, "journal", None)
        if journal is None:  # the history inside the state file
            doc.history = padded  # type: ignore[attr-defined]
        else:  # the history in its journal beside it, numbered; the state names the last
            journal.rewrite([{**e, "seq": i} for i, e in enumerate(padded, 1)])
            doc.seq = len(padded)
        node.store.write(doc)
    return cfg


def _history_of(store: Store) -> list[dict[str, Any]]:
    """The history as the store keeps it (in the state file, or in a journal beside it)."""
    if hasattr(store, "history"):
        return list(store.history())
    return list(store.read().history)  # type: ignore[attr-defined]


def _run_env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}


def _timed(argv: list[str]) -> tuple[float, float]:
    """Wall and CPU (user + system) milliseconds of one run of `argv`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, env=_run_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                   check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall * 1000, cpu * 1000


def import_breakdown(argv: list[str], top: int = 8) -> dict[str, float]:
    """Milliseconds spent importing, per top-level package (the standard library as one), in
    one run under `python -X importtime`: the modules' own times, summed, so nothing counts
    twice. Imports made while running count too (typer imports pydantic as it parses options).
    """
    proc = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], env=_run_env(),
                          capture_output=True, text=True, check=True)
    totals: dict[str, float] = {}
    for line in proc.stderr.splitlines():
        parts = line.split("|")
        if not line.startswith("import time:") or len(parts) != 3:
            continue
        own = parts[0].removeprefix("import time:").strip()
        if not own.isdigit():
            continue  # the header line
        package = parts[2].strip().split(".")[0]
        if package in sys.stdlib_module_names or package.startswith("_"):
            package = "(standard library)"
        totals[package] = totals.get(package, 0.0) + int(own) / 1000
    ranked = sorted(totals.items(), key=lambda kv: kv[1], reverse=True)
    return {k: round(v, 1) for k, v in ranked[:top]}


# What `status --json` does, without the command line (no typer, pydantic or rich): a measure of
# what a CLI-free path to it would cost.
STATUS_WITHOUT_CLI = """\
import json, sys
from pathlib import Path
from agent_fsm.node import config
from agent_fsm import wiring
from agent_fsm.views.status.report import status
n = wiring.open_reader(config.load(Path(sys.argv[1])), Path(sys.argv[2]))
print(json.dumps(status(n).to_json(), indent=2))
"""


def status_figures(workdir: Path, repeat: int) -> list[Figure]:
    base = workdir / "status"
    nodes = {
        "default": make_status_node(base / "default", 200, None),
        "10": make_status_node(base / "h10", 10, 10_000),
        "10000": make_status_node(base / "h10000", 10_000, 10_000),
    }

    def status_argv(cfg: Path) -> list[str]:
        return [sys.executable, "-m", "agent_fsm", "--config", str(cfg), "--root",
                str(cfg.parent), "status", "--json"]

    argvs: dict[str, list[str]] = {"pass": [sys.executable, "-c", "pass"]}
    for key, cfg in nodes.items():
        argvs[key] = status_argv(cfg)
        out = subprocess.run(argvs[key], env=_run_env(), capture_output=True, text=True, check=True)
        st = json.loads(out.stdout)  # also the warm-up: bytecode is compiled by now
        if (st["state"], st["gate"], st["selected"]) != ("converged", "open", "2.0.0"):
            raise BenchError(f"the status node {cfg.parent} is not as built: {st}")
    cfg = nodes["default"]
    argvs["no_cli"] = [sys.executable, "-c", STATUS_WITHOUT_CLI, str(cfg), str(cfg.parent)]
    wall: dict[str, list[float]] = {k: [] for k in argvs}
    cpu: dict[str, list[float]] = {k: [] for k in argvs}
    for _ in range(3 * repeat):  # interleaved, so that drift and load hit all alike
        for key, argv in argvs.items():
            w, c = _timed(argv)
            wall[key].append(w)
            cpu[key].append(c)

    def med(xs: list[float]) -> float:
        return round(statistics.median(xs), 1)

    sizes = {k: {f.name: f.stat().st_size for f in (c.parent / "var/lib/agent-fsm").iterdir()
                 if f.is_file() and not f.name.endswith(".lock")} for k, c in nodes.items()}
    status = figure(
        "status_json", wall["default"], wall["pass"],
        {"history_entries": 200, "file_bytes": sizes["default"],
         "python": sys.version.split()[0],
         "cpu_ms": {"status": med(cpu["default"]), "pass": med(cpu["pass"])},
         "without_cli_ms": {"wall": med(wall["no_cli"]), "cpu": med(cpu["no_cli"]),
                            "ratio": round(statistics.median(wall["no_cli"])
                                           / statistics.median(wall["pass"]), 2)},
         "import_ms_by_package": import_breakdown(argvs["default"])},
    )
    long = figure(
        "status_json_long_history", wall["10000"], wall["10"],
        {"history_limit": 10_000, "file_bytes": {"10": sizes["10"], "10000": sizes["10000"]},
         "cpu_ms": {"10000": med(cpu["10000"]), "10": med(cpu["10"])},
         "default_history_limit": Config().history_limit,
         "status_ms_at_default_limit_200_entries": med(wall["default"]),
         "note": "with the default history_limit a node keeps 200 entries, however many "
                 "upgrades it went through"},
    )
    return [status, long]


# Release figures ---------------------------------------------------------------------------------
def release_figures(workdir: Path, repeat: int) -> list[Figure]:
    """`release pack` and `release add` against a plain copy of the tree they make or store,
    and the disk ten stored releases take against one."""
    packs, copies = [], []
    base = workdir / "packs"
    base.mkdir(parents=True, exist_ok=True)
    for i in range(repeat):
        out = base / f"pack-{i}"
        t0 = time.perf_counter()
        packing.pack("1.0.0", out)
        packs.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        subprocess.run(["cp", "-a", str(out), str(base / f"copy-{i}")], check=True)
        copies.append(time.perf_counter() - t0)
    tree = base / "pack-0"
    found = [f for f in tree.rglob("*") if f.is_file()]
    need = abi.read(tree)
    return [figure("release_pack", packs, copies, {
        "bytes": sum(f.stat().st_size for f in found), "files": len(found),
        "covers": abi.covers(need.targets) if need else "unchecked",
        "python": sys.version.split()[0]}), *store_figures(workdir, repeat)]


def _with_payload(release: Path, version: str) -> Path:
    """A packed release with a small payload of its own (what a user's agent adds)."""
    (release / "payload").mkdir()
    (release / "payload" / "agent.sh").write_text(f"#!/bin/sh\necho agent {version}\n")
    (release / "payload" / "agent.sh").chmod(0o755)
    (release / "payload" / "agent.toml").write_text(f'version = "{version}"\nlevel = "info"\n')
    return release


def _store_node(root: Path) -> Node:
    """A fresh node below `root` whose interpreter (below --root) is this one."""
    root.mkdir(parents=True)
    node = open_node(Config(name="agent"), root, systemd=FakeSystemd(), publisher=FakePublisher())
    python = node.paths.real(node.config.python)
    python.parent.mkdir(parents=True, exist_ok=True)
    python.symlink_to(sys.executable)
    return node


def store_figures(workdir: Path, repeat: int) -> list[Figure]:
    """`release add` of a first and of a next release against `cp -a` of each, and the store's
    size with ten releases against one (one run: a size does not vary)."""
    from agent_fsm.node.releases import objects

    base = workdir / "store"
    packs = [_with_payload(packing.pack(f"1.{i}.0", base / "packs" / f"1.{i}.0"), f"1.{i}.0")
             for i in range(10)]
    first, first_cp, next_, next_cp = [], [], [], []
    for i in range(repeat):
        node = _store_node(base / f"node-{i}")
        for release, times, floor in ((packs[0], first, first_cp), (packs[1], next_, next_cp)):
            t0 = time.perf_counter()
            packing.add(release, node)
            times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            subprocess.run(["cp", "-a", str(release), str(base / f"cp-{i}-{release.name}")],
                           check=True)
            floor.append(time.perf_counter() - t0)
    node = _store_node(base / "ten")
    sizes = []
    for release in packs:
        packing.add(release, node)
        sizes.append(objects.usage(node.paths.releases_dir) / 1e6)
    kept = sum(1 for _ in (node.paths.releases_dir / objects.OBJECTS).iterdir())
    files_ = sum(1 for f in packs[0].rglob("*") if f.is_file())
    return [figure("release_add", first, first_cp, {"files": files_}),
            figure("release_add_next", next_, next_cp, {"files": files_}),
            figure("store_ten_releases", [sizes[-1]], [sizes[0]], {
                "mb_after_each_add": [round(x, 2) for x in sizes], "objects": kept,
                "files_per_release": files_, "filesystem": filesystem_of(base)})]


# Systemd figures ---------------------------------------------------------------------------------
@contextlib.contextmanager
def lab_node(settings: dict[str, float],
             last_good: Callable[[Path], object] | None = None) -> Iterator[Lab]:
    """A private systemd with 1.0.0 (good) installed and settled, with these judgment settings
    (`last_good`: packs 1.0.0 at the path it is given, instead of the lab's)."""
    with SystemdSandbox(keep=python_paths()) as sb:
        lab = Lab(sb, deadline=settings["deadline"], soak=settings["soak"],
                  max_attempts=int(settings["max_attempts"]), restart=settings["restart"])
        if last_good is None:
            lab.pack("1.0.0")
        else:
            lab.packs.mkdir(parents=True, exist_ok=True)
            last_good(lab.packs / "1.0.0")
            lab.cli("release", "add", str(lab.packs / "1.0.0"))
        lab.install("1.0.0")
        yield lab


def restart_to_ready(lab: Lab) -> float:
    """`systemctl restart` of the agent, which returns when the start job is done: READY=1."""
    lab.sb.systemctl("reset-failed", UNIT)  # manual restarts count against StartLimitBurst too
    elapsed = _timed_restart(lab, UNIT, "the agent")
    lab.settled()
    return elapsed


def _timed_restart(lab: Lab, unit: str, what: str) -> float:
    """Seconds `systemctl restart UNIT` takes: to READY=1 for a Type=notify unit."""
    t0 = time.perf_counter()
    lab.sb.systemctl("restart", unit)
    elapsed = time.perf_counter() - t0
    if lab.sb.show(unit, "ActiveState") != "active":
        raise BenchError(f"{what} is not active after `systemctl restart`\n"
                         + lab.sb.diagnostics(unit))
    return elapsed


def timed_upgrade(lab: Lab, version: str, *, rolled_back: bool) -> tuple[float, list[Any]]:
    """`upgrade --wait` until the node is back on an active agent with the gate open.

    `--wait` returns once the state is converged with the gate open and the signal cleared;
    the daemon sends READY=1 right after opening the gate, so the clock stops at the first
    `ActiveState=active` seen from then on (usually at once). Returns the seconds taken and
    the timeline: each transition recorded meanwhile, as (trigger, seconds from the start).
    """
    before = lab.status()["selected"]
    started = time.time()
    t0 = time.perf_counter()
    proc = lab.cli("upgrade", "--to", version, "--wait", "--timeout", "120", check=False)
    end = time.perf_counter()
    expected = 4 if rolled_back else 0
    if proc.returncode != expected:
        raise BenchError(f"`upgrade --to {version} --wait` exited {proc.returncode}, expected "
                         f"{expected}\n{proc.stdout}{proc.stderr}"
                         + lab.sb.diagnostics(UNIT, RECOVERY_UNIT))
    while lab.sb.show(UNIT, "ActiveState") != "active":
        if time.perf_counter() - end > 60:
            raise BenchError("the agent did not become active\n" + lab.sb.diagnostics(UNIT))
        time.sleep(0.01)
        end = time.perf_counter()
    elapsed = end - t0
    st = lab.settled()
    want = before if rolled_back else version
    if st["selected"] != want or st["signal"] is not None or st["gate"] != "open":
        raise BenchError(f"after the upgrade to {version}: {st}, expected {want} selected")
    timeline: list[Any] = [(e["trigger"], round(e["time"] - started, 2)) for e in lab.history()
                           if e["time"] >= started]
    return elapsed, [*timeline, ("READY=1, gate open", round(elapsed, 2))]


def install_notify_floor(lab: Lab) -> None:
    """The bare-Python Type=notify service `daemon_start_to_ready` compares the agent with."""
    script = lab.dir / "notify-floor.py"
    script.write_text(NOTIFY_FLOOR_SCRIPT)
    python = str(lab.config.read_text().split('python = "', 1)[1].split('"', 1)[0])
    lab.sb.write_unit(NOTIFY_FLOOR_UNIT, "[Unit]\nDescription=bench floor: READY=1 from a bare "
                      "Python\n\n[Service]\nType=notify\n"
                      f"ExecStart={python} -I -S -B {script}\n")


def notify_floor_to_ready(lab: Lab) -> float:
    """`systemctl restart` of the bare-Python notify service: returns at its READY=1."""
    return _timed_restart(lab, NOTIFY_FLOOR_UNIT, "the notify floor")


def upgrade_figures(repeat: int) -> list[Figure]:
    good, crash, unhealthy, start = (figure(n) for n in (
        "good_upgrade", "rollback_crash_at_start", "rollback_failed_health",
        "daemon_start_to_ready"))
    floor: list[float] = []
    # (figure, judgment settings, kind of candidate, major version, what is subtracted)
    runs: list[tuple[Figure, dict[str, float], Kind, str, tuple[str, ...]]] = [
        (good, GOOD, "good", "2", ("soak",)),
        (crash, CRASH, "crash", "3", ("restarts",)),
        (unhealthy, UNHEALTHY, "unhealthy", "4", ("soak", "deadline")),
    ]
    for fig, settings, kind, major, policy in runs:
        say(f"  {fig.name}: private systemd, {kind} candidates, {settings}")
        walls: list[float] = []
        timelines: list[list[Any]] = []
        waits = {**settings, "restarts": settings["restart"] * settings["max_attempts"]}
        subtracted = sum(waits[k] for k in policy)
        with lab_node(settings) as lab:
            install_notify_floor(lab)
            for i in range(repeat):
                version = f"{major}.{i}.0"
                lab.pack(version, kind)
                start.floor_samples.append(notify_floor_to_ready(lab))
                floor.append(restart_to_ready(lab))
                wall, timeline = timed_upgrade(lab, version, rolled_back=kind != "good")
                walls.append(wall)
                timelines.append(timeline)
                fig.samples.append(wall - subtracted)
        fig.details = {
            "judgment": {"deadline_seconds": settings["deadline"],
                         "soak_seconds": settings["soak"],
                         "max_attempts": int(settings["max_attempts"]),
                         "restart_seconds": settings["restart"]},
            "subtracted_s": {k: waits[k] for k in policy},
            "wall_s": [round(w, 3) for w in walls],
            "timelines_s": timelines,
        }
        fig.details["median_wall_s"] = round(statistics.median(walls), 3)
    for fig, *_ in runs:
        fig.floor_samples = list(floor)  # one floor, measured before every upgrade of all three
    unhealthy.details["ratio_without_subtracting_the_deadline"] = round(
        (unhealthy.details["median_wall_s"] - UNHEALTHY["soak"]) / statistics.median(floor), 2)
    crash.details["ratio_without_subtracting_the_restart_waits"] = round(
        crash.details["median_wall_s"] / statistics.median(floor), 2)
    start.samples = list(floor)
    start.details = {"converged_agent_restarts_s": [round(x, 3) for x in floor],
                     "notify_floor_restarts_s": [round(x, 3) for x in start.floor_samples],
                     "floor_unit": "Type=notify, ExecStart=<the node's python> -I -S -B "
                                   "<script: send READY=1, pause>"}
    return [good, crash, unhealthy, start]


def _proc_status(pid: int) -> dict[str, int]:
    wanted = ("VmRSS", "VmHWM", "voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in wanted:
            out[key] = int(rest.split()[0])
    return out


def idle_figures(workdir: Path) -> list[Figure]:
    rss = figure("daemon_idle_rss", floor_samples=[RSS_FLOOR_MB])
    wake = figure("daemon_idle_wakeups", floor_samples=[WAKEUPS_FLOOR])
    with lab_node(GOOD) as lab:
        watchdog = lab.sb.show(UNIT, "WatchdogUSec")
        pid = lab.sb.host_pid(lab.main_pid())
        time.sleep(IDLE_SETTLE)
        before, t_before = _proc_status(pid), time.monotonic()
        rss.samples.append(before["VmRSS"] / 1024)
        involuntary = []
        for interval in IDLE_INTERVALS:
            time.sleep(interval)
            now, t_now = _proc_status(pid), time.monotonic()
            dt = t_now - t_before
            wake.samples.append((now["voluntary_ctxt_switches"]
                                 - before["voluntary_ctxt_switches"]) / dt)
            involuntary.append((now["nonvoluntary_ctxt_switches"]
                                - before["nonvoluntary_ctxt_switches"]) / dt)
            rss.samples.append(now["VmRSS"] / 1024)
            before, t_before = now, t_now
        if lab.sb.host_pid(lab.main_pid()) != pid:
            raise BenchError("the agent restarted while idle\n" + lab.sb.diagnostics(UNIT))
        rss.details = {"peak_rss_mb": round(before["VmHWM"] / 1024, 1), "process": "MainPID only",
                       "cmdline": Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip()}
        wake.details = {"WatchdogUSec": watchdog, "intervals_s": list(IDLE_INTERVALS),
                        "involuntary_per_s": [round(x, 3) for x in involuntary]}
        starts = [restart_to_ready(lab) for _ in range(STARTS)]
    return [rss, wake, *many_files(workdir, rss.samples, starts)]


def many_files(workdir: Path, small_rss: list[float], small_starts: list[float]) -> list[Figure]:
    """The daemon's idle VmRSS and its start (`systemctl restart` to READY=1) when its release
    carries 20,000 small files (a `node_modules`), against the same daemon's with the lab's
    small release: a start checks every file, and what it keeps of that check stays while the
    node idles."""
    from agent_fsm.actions.releases import packing
    from agent_fsm_lab.lab import GOOD_WORKLOAD

    from . import big

    payload = workdir / "idle-files"
    big.small_files(payload)
    fig = figure("daemon_idle_rss_files", floor_samples=list(small_rss))
    start = figure("daemon_start_files", floor_samples=list(small_starts))

    def last_good(at: Path) -> None:
        packing.pack("1.0.0", at, GOOD_WORKLOAD, payload=payload)

    with lab_node(GOOD, last_good=last_good) as lab:
        pid = lab.sb.host_pid(lab.main_pid())
        time.sleep(IDLE_SETTLE)
        for interval in (0.0, *IDLE_INTERVALS[1:]):
            time.sleep(interval)
            fig.samples.append(_proc_status(pid)["VmRSS"] / 1024)
        fig.details = {"files": big.SMALL_FILES, "peak_rss_mb": round(
            _proc_status(pid)["VmHWM"] / 1024, 1)}
        start.samples = [restart_to_ready(lab) for _ in range(STARTS)]
        start.details = {"files": big.SMALL_FILES}
    shutil.rmtree(payload)
    return [fig, start]


# Running and reporting ---------------------------------------------------------------------------
def run(groups: list[str], repeat: int, workdir: Path) -> list[Figure]:
    figures: list[Figure] = []
    missing = missing_requirements()
    steps: dict[str, Callable[[], list[Figure]]] = {
        "durable": lambda: [durable_transition(workdir, repeat)],
        "status": lambda: status_figures(workdir, repeat),
        "releases": lambda: release_figures(workdir, repeat),
        "big": lambda: big.measure(workdir, repeat, figure, _store_node),
        "upgrades": lambda: upgrade_figures(repeat),
        "wayback": lambda: wayback.measure(workdir, repeat, figure),
        "idle": lambda: idle_figures(workdir),
    }
    for group in groups:
        if group in ("upgrades", "wayback", "idle") and missing:
            why = "cannot boot a private systemd here: " + "; ".join(missing)
            say(f"{group}: skipped ({why})")
            figures += [figure(n, skipped=why) for n, spec in SPECS.items() if spec[0] == group]
            continue
        say(f"{group}...")
        t0 = time.monotonic()
        figures += steps[group]()
        say(f"{group}: {time.monotonic() - t0:.0f} s")
    return figures


def _fmt(x: float | None, unit: str) -> str:
    if x is None:
        return "—"
    if unit == "ms":
        return f"{x:.1f} ms"
    if unit == "s":
        return f"{x:.2f} s"
    if unit == "MB":
        return f"{x:.1f} MB"
    return f"{x:.2f}{unit}"


def report(figures: list[Figure]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="agent-fsm benchmarks (medians; ratio = value / floor)")
    for col, justify in (("benchmark", "left"), ("value", "right"), ("floor", "right"),
                         ("ratio", "right"), ("min-max", "right"), ("target", "right"),
                         ("", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for f in figures:
        verdict = ("skipped" if f.skipped else "[green]pass[/]" if f.passed else "[red]MISS[/]")
        spread = f.details.get("ratio_min_median_max")
        table.add_row(f.name, _fmt(f.value, f.unit), _fmt(f.floor, f.unit),
                      "—" if f.ratio is None else f"{f.ratio:.2f}",
                      f"{spread[0]:.2f}-{spread[2]:.2f}" if spread else "",
                      f"≤ {f.target:g}", verdict)
    Console(stderr=False).print(table)


def write_chart(figures: list[Figure], path: Path) -> None:
    from .chart import svg

    rows = [(f.name, f.ratio, f.target, f.passed) for f in figures]
    path.write_text(svg(rows, f"agent-fsm benchmarks, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5, help="runs per figure (default 5)")
    parser.add_argument("--only", action="append", choices=GROUPS,
                        help="run only this group (repeatable): " + ", ".join(GROUPS))
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT,
                        help=f"where to write the JSON (default {DEFAULT_OUTPUT.relative_to(REPO)})")
    parser.add_argument("--chart", type=Path, default=DEFAULT_CHART,
                        help=f"where to write the SVG chart (default {DEFAULT_CHART.relative_to(REPO)})")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a figure misses")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    workdir = Path(tempfile.mkdtemp(prefix="agent-fsm-bench-", dir=WORK_BASE))
    os.environ.setdefault("AGENT_FSM_CACHE_DIR", str(workdir / "lib-cache"))  # packs' lib/
    t0 = time.monotonic()
    try:
        figures = run(args.only or list(GROUPS), args.repeat, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps([f.to_json() for f in figures], indent=2) + "\n")
    report(figures)
    write_chart(figures, args.chart)
    say(f"wrote {args.output} and {args.chart} in {time.monotonic() - t0:.0f} s")
    return 1 if args.strict and any(f.passed is False for f in figures) else 0


if __name__ == "__main__":
    sys.exit(main())
