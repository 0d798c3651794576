"""How many bytes a rollback writes to disk: `recover` (the recovery unit's) and `recovered` (the
last-good's daemon, back), counted by strace(1) on the real processes, file by file.

The node is in a temporary directory on the real disk (`/var/tmp`), converged on 1.0.0 with 200
transitions of history, then upgraded to 2.0.0, whose candidate was judged failed (as the
daemon leaves it: `judge_failed` recorded, the recovery unit to start). Then, each under strace:

- `agent-fsm recover`, with a systemctl stub on PATH that succeeds (the process boundary);
- the last-good's daemon's transition, `recovered`, fired as the daemon fires it.

Every write(2)/pwrite64(2) to a regular file is summed by the file's name (a temporary file of
the atomic writer counts for the file it replaces), with the number of fsyncs and renames. What
a rollback must write is what this prints; docs/reliability.md quotes the figures.

    python -m bench.rollback_bytes [--keep]
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path

from agent_fsm.node import config as config_mod
from agent_fsm.testing import FakeClock, FakePublisher, FakeSystemd
from agent_fsm.wiring import open_node

REPO = Path(__file__).resolve().parent.parent
CONFIG = 'name = "agent"\n[judgment]\ndeadline_seconds = 60\nsoak_seconds = 5\n'
HISTORY = 200  # transitions before the upgrade: the journal is as long as a node's

FIRE_RECOVERED = """
import sys
from pathlib import Path
from agent_fsm.node import config
from agent_fsm.wiring import open_node
node = open_node(config.load(Path(sys.argv[1]), Path(sys.argv[2]), lenient=True), Path(sys.argv[2]))
node.controller.fire("recovered")
"""

_WRITE = re.compile(r'^(?:\[pid +\d+\] |\d+ +)?(p?write(?:64)?)\((\d+)<([^>]*)>, .*\) = (\d+)$')
_FSYNC = re.compile(r'^(?:\[pid +\d+\] |\d+ +)?f(?:data)?sync\(\d+<([^>]*)>')
_RENAME = re.compile(r'^(?:\[pid +\d+\] |\d+ +)?renameat2?\(')


def _release(root: Path, version: str) -> None:
    release = root / "var/lib/agent-fsm/releases" / version
    (release / "assets").mkdir(parents=True)
    for name in ("agent.service", "recovery.service", "recovery.sh"):
        text = (resources.files("agent_fsm") / "templates" / name).read_text()
        (release / "assets" / name).write_text(text)
    (release / "release.toml").write_text(f'version = "{version}"\n')


def prepare(base: Path) -> tuple[Path, Path]:
    """A node below base/root where a candidate was just judged failed, and its config."""
    root = base / "root"
    cfg = base / "config.toml"
    cfg.write_text(CONFIG)
    config = config_mod.load(cfg, root)  # as the processes below read it: the same assets
    node = open_node(config, root, systemd=FakeSystemd(), publisher=FakePublisher(),
                     clock=FakeClock())
    node.paths.gate_file.parent.mkdir(parents=True, exist_ok=True)
    for v in ("1.0.0", "2.0.0"):
        _release(root, v)
    node.controller.fire("install", release="1.0.0")
    for _ in range(HISTORY - 1):
        node.controller.fire("settle")
    node.controller.fire("begin_upgrade", release="2.0.0")
    node.controller.fire("candidate_started")
    node.controller.fire("judge_failed", reason="checks still failing at the deadline",
                         reason_class="check_failed")
    return root, cfg


def _stub_env(base: Path) -> dict[str, str]:
    bindir = base / "bin"
    bindir.mkdir(exist_ok=True)
    stub = bindir / "systemctl"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "AGENT_FSM_"))}
    return {**env, "PATH": f"{bindir}:{env['PATH']}", "PYTHONPATH": str(REPO),
            "PYTHONDONTWRITEBYTECODE": "1"}


def traced(argv: list[str], env: dict[str, str], under: Path, trace: Path) -> dict[str, object]:
    """Run argv under strace; the bytes written to each file below `under`, fsyncs, renames."""
    subprocess.run(["strace", "-f", "-qq", "-y", "-e", "trace=write,pwrite64,fsync,fdatasync,"
                    "rename,renameat,renameat2", "-o", str(trace), *argv],
                   env=env, check=True, cwd=REPO, capture_output=True, timeout=120)
    by_file: collections.Counter[str] = collections.Counter()
    fsyncs = renames = 0
    for line in trace.read_text().splitlines():
        if (m := _WRITE.match(line)) and m.group(3).startswith(str(under)):
            by_file[_logical(m.group(3), under)] += int(m.group(4))
        elif (f := _FSYNC.match(line)) and f.group(1).startswith(str(under)):
            fsyncs += 1
        elif _RENAME.match(line):
            renames += 1
    return {"files": dict(by_file), "bytes": sum(by_file.values()), "fsyncs": fsyncs,
            "renames": renames}


def _logical(path: str, under: Path) -> str:
    """The file a write is for: `.name.<token>.tmp` is the atomic writer's copy of `name`."""
    rel = os.path.relpath(path, under)
    head, name = os.path.split(rel)
    if m := re.fullmatch(r"\.(.+)\.[0-9a-f]{12}\.tmp", name):
        name = m.group(1)
    return os.path.join(head, name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep the node's directory")
    args = parser.parse_args(argv)
    if shutil.which("strace") is None:
        print("strace is not installed (Debian: apt-get install strace)", file=sys.stderr)
        return 1
    base = Path(tempfile.mkdtemp(prefix="rollback-bytes.", dir="/var/tmp"))
    try:
        root, cfg = prepare(base)
        env = _stub_env(base)
        steps = {
            "recover": traced([sys.executable, "-m", "agent_fsm", "--config", str(cfg), "--root",
                               str(root), "recover"], env, root, base / "recover.trace"),
            "recovered": traced([sys.executable, "-c", FIRE_RECOVERED, str(cfg), str(root)],
                                env, root, base / "recovered.trace"),
        }
        total = 0
        for step, seen in steps.items():
            files = seen["files"]
            assert isinstance(files, dict)
            print(f"{step}: {seen['bytes']} bytes, {seen['fsyncs']} fsyncs, "
                  f"{seen['renames']} renames")
            for name, n in sorted(files.items(), key=lambda kv: -kv[1]):
                print(f"  {n:8d}  {name}")
            total += int(str(seen["bytes"]))
        print(f"rollback (recover + recovered): {total} bytes")
    finally:
        if args.keep:
            print(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
