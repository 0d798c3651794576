"""Many operator processes at once: one upgrade begins, the rest are refused cleanly, readers
never block or see a torn state, and a killed lock holder wedges no one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.helpers import env_with_stub_systemctl, make_world

ROOT = Path(__file__).resolve().parents[2]
CONFIG = 'name = "agent"\n[judgment]\ndeadline_seconds = 60\nsoak_seconds = 5\nmax_attempts = 3\n'


def test_concurrent_upgrades_recovers_and_status(tmp_path: Path) -> None:
    """12 upgrades, 4 recovers and 12 status readers at once: exactly one upgrade begins, every
    other upgrade exits 3 with a reason, every status parses, the lock file stays."""
    world = make_world(tmp_path / "root").installed("1.0.0")
    world.add_release("2.0.0")
    cfg = tmp_path / "config.toml"
    cfg.write_text(CONFIG)
    base = [sys.executable, "-m", "agent_fsm", "--config", str(cfg), "--root", str(world.root)]
    env = env_with_stub_systemctl(tmp_path)
    cmds = ([["upgrade", "--to", "2.0.0"]] * 12 + [["recover"]] * 4
            + [["status", "--json"]] * 12)
    procs = [(c, subprocess.Popen([*base, *c], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)) for c in cmds]
    results = [(c, p.wait(timeout=120), *p.communicate()) for c, p in procs]

    upgrades = [r for r in results if r[0][0] == "upgrade"]
    assert sorted(code for _, code, _, _ in upgrades) == [0] + [3] * 11, upgrades
    for _, code, _, err in upgrades:
        if code == 3:
            assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert all(code == 0 for c, code, _, _ in results if c[0] == "recover")
    for c, code, out, _ in results:
        if c[0] == "status":
            assert code == 0 and json.loads(out)["state"] in {
                "converged", "candidate_running", "recovering"}
    begun = [h for h in world.node.store.history() if h["trigger"] == "begin_upgrade"]
    assert len(begun) == 1
    assert world.paths.lock_file.exists()


def test_killed_lock_holder_does_not_wedge(tmp_path: Path) -> None:
    """A process that dies holding the writers' lock (SIGKILL) releases it: the next writer
    goes on at once."""
    world = make_world(tmp_path / "root").installed("1.0.0")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import filelock,sys,time; filelock.FileLock(sys.argv[1]).acquire();"
         "print('held', flush=True); time.sleep(300)", str(world.paths.lock_file)],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    world.node.store.lock_timeout = 5  # a wedged lock would raise Refused after this
    world.node.controller.fire("settle")
    assert world.paths.lock_file.exists()
