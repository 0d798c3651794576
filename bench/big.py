"""Agents of a real size (`make bench`, group `big`): `release pack` and `release add` of a
runtime binary with 20,000 small files, and of a 1 GiB tree, each against `cp -a` of the same
tree in the same run, and the peak RSS of a `release add` of the 1 GiB release.

The payloads are made in the bench's work directory on the real disk: the node's `node` binary
(Debian's Node.js: one 98 MB file; where there is none, 98 MB of random bytes stand in), 52 MB
of random bytes beside it, and 20,000 files of 200 bytes in 200 directories; the 1 GiB tree is
eight files of 128 MiB of random bytes (random: nothing compresses or deduplicates it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RUNTIME = Path("/usr/bin/node")
RUNTIME_BYTES = 98 << 20  # what stands in for it where it is missing
SMALL_FILES = 20_000
SMALL_DIRS = 200
SMALL_BYTES = 200
TREE_FILES = 8
TREE_FILE_BYTES = 128 << 20  # 1 GiB in all
RSS_BUDGET_MB = 100.0
CHUNK = 8 << 20


def _random_file(path: Path, size: int) -> None:
    with path.open("wb") as f:
        left = size
        while left:
            n = min(CHUNK, left)
            f.write(os.urandom(n))
            left -= n


def runtime_payload(where: Path) -> dict[str, Any]:
    """A Node.js-sized agent: the runtime binary, a bundle, and 20,000 small files."""
    where.mkdir(parents=True)
    (where / "bin").mkdir()
    real = RUNTIME.resolve() if RUNTIME.exists() else None
    if real is not None:
        shutil.copy2(real, where / "bin" / "node")
    else:
        _random_file(where / "bin" / "node", RUNTIME_BYTES)
        (where / "bin" / "node").chmod(0o755)
    _random_file(where / "bundle.bin", 52 << 20)
    small_files(where)
    return {"runtime": str(real) if real else "random bytes (no /usr/bin/node here)",
            "bytes": _bytes(where), "files": _files(where)}


def small_files(where: Path) -> None:
    """`node_modules/`: SMALL_FILES files of SMALL_BYTES in SMALL_DIRS directories."""
    modules = where / "node_modules"
    for d in range(SMALL_DIRS):
        sub = modules / f"pkg{d:03d}"
        sub.mkdir(parents=True)
        for i in range(SMALL_FILES // SMALL_DIRS):
            (sub / f"f{i:03d}.js").write_bytes(f"// {d}/{i}\n".encode().ljust(SMALL_BYTES, b" "))


def tree_payload(where: Path) -> dict[str, Any]:
    where.mkdir(parents=True)
    for i in range(TREE_FILES):
        _random_file(where / f"blob{i}.bin", TREE_FILE_BYTES)
    return {"bytes": _bytes(where), "files": _files(where)}


def _bytes(tree: Path) -> int:
    return sum(f.stat().st_size for f in tree.rglob("*") if f.is_file())


def _files(tree: Path) -> int:
    return sum(1 for f in tree.rglob("*") if f.is_file())


def _timed(job: Callable[..., object], *args: Any, **kwargs: Any) -> float:
    """Seconds `job` takes, from a disk with nothing dirty: each run then pays its own
    writeback, not the one before it."""
    os.sync()
    t0 = time.perf_counter()
    job(*args, **kwargs)
    return time.perf_counter() - t0


def _cp(src: Path, dst: Path) -> None:
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True)


def _cp_durable(src: Path, dst: Path) -> tuple[float, float]:
    """Seconds of `cp -a src dst` alone, and with a sync of what it wrote after it: `release
    add` ends with its copy on the disk (one syncfs), and `cp -a` of hot pages writes nothing
    back before it ends."""
    os.sync()
    t0 = time.perf_counter()
    _cp(src, dst)
    copied = time.perf_counter() - t0
    os.sync()
    return copied, time.perf_counter() - t0


ADD_CHILD = """
import sys
from pathlib import Path
from bench.run import _store_node
from agent_fsm.actions.releases import packing
packing.add(Path(sys.argv[1]), _store_node(Path(sys.argv[2])))
"""


def peak_rss_of_add(release: Path, root: Path) -> float:
    """The peak RSS (MB) of a process that adds `release` to a fresh node below `root`."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    child = subprocess.Popen([sys.executable, "-c", ADD_CHILD, str(release), str(root)], env=env)
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"release add of {release} exited {child.returncode}")
    return usage.ru_maxrss / 1024


def two_versions(base: Path, payload: Path, first: Path, figure: Callable[..., Any],
                 store_node: Callable[[Path], Any]) -> Any:
    """The store's bytes on disk holding two versions of the runtime agent that differ in one
    small file of the payload, against the same store holding the first alone."""
    from agent_fsm.actions.releases import packing
    from agent_fsm.node.releases import objects

    changed = payload / "node_modules" / "pkg000" / "f000.js"
    was = changed.read_bytes()
    changed.write_bytes(b"// the next version\n".ljust(SMALL_BYTES, b" "))
    try:
        second = packing.pack("2.0.1", base / "runtime-pack-next", payload=payload)
    finally:
        changed.write_bytes(was)
    node = store_node(base / "two-node")
    packing.add(first, node)
    one = objects.usage(node.paths.releases_dir)
    packing.add(second, node)
    two = objects.usage(node.paths.releases_dir)
    shutil.rmtree(base / "two-node")
    shutil.rmtree(second)
    return figure("store_two_versions", [two / 1e6], [one / 1e6], {
        "differs_in": "one 200-byte file of the payload (and the version in release.toml, "
                      "bin/agent-fsm and lib/'s boot file)",
        "mb_one": round(one / 1e6, 1), "mb_two": round(two / 1e6, 1)})


def measure(workdir: Path, repeat: int, figure: Callable[..., Any],
            store_node: Callable[[Path], Any]) -> list[Any]:
    from agent_fsm.actions.releases import packing

    base = workdir / "big"
    # A gigabyte a run: four runs give a median, each job and its floor taken in turn first and
    # second. What runs just before a step changes its kernel cost here (files made soon after
    # many were deleted cost more; pages just freed are cheaper to write), so neither side always
    # follows the last run's deletions.
    repeat = min(max(repeat, 2), 4)
    figures = []
    for name, make, version in (("runtime", runtime_payload, "2.0.0"),
                                ("tree_1g", tree_payload, "3.0.0")):
        payload = base / f"payload-{name}"
        made = make(payload)
        packs, pack_floor, adds, add_floor, add_cp_alone = [], [], [], [], []
        for i in range(repeat):
            out = base / f"{name}-pack-{i}"
            cp_payload, cp_release = base / f"{name}-cp-payload-{i}", base / f"{name}-cp-release-{i}"
            floor_first = i % 2 == 1
            if floor_first:
                pack_floor.append(_timed(_cp, payload, cp_payload))
            packs.append(_timed(packing.pack, version, out, payload=payload))
            if not floor_first:
                pack_floor.append(_timed(_cp, payload, cp_payload))
            cp_times: list[tuple[float, float]] = []
            if floor_first:
                cp_times.append(_cp_durable(out, cp_release))
            node = store_node(base / f"{name}-node-{i}")
            adds.append(_timed(packing.add, out, node))
            if not floor_first:
                cp_times.append(_cp_durable(out, cp_release))
            add_cp_alone.append(cp_times[0][0])
            add_floor.append(cp_times[0][1])
            for gone in (cp_payload, cp_release, base / f"{name}-node-{i}"):
                shutil.rmtree(gone)
            if i:
                shutil.rmtree(out)
        figures += [figure(f"release_pack_{name}", packs, pack_floor, made),
                    figure(f"release_add_{name}", adds, add_floor, {
                        **made, "floor": "`cp -a` of the packed release, then `sync`",
                        "cp_alone_s": [round(x, 3) for x in add_cp_alone]})]
        if name == "runtime":
            figures.append(two_versions(base, payload, base / f"{name}-pack-0", figure,
                                        store_node))
        if name == "tree_1g":
            rss = peak_rss_of_add(base / f"{name}-pack-0", base / "rss-node")
            figures.append(figure("release_add_peak_rss", [rss], [RSS_BUDGET_MB],
                                  {**made, "process": "a child adding the 1 GiB release"}))
        shutil.rmtree(payload)
        shutil.rmtree(base / f"{name}-pack-0")
    return figures
