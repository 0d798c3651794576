"""`agent-fsm recover` as the recovery unit runs it is retried until the rollback is done:
it exits 0 when rolled back or when there is nothing to roll back, and otherwise,
after a wait that grows with the unit's restarts, non-zero, for systemd's `Restart=on-failure`.
A read-only state dir is one line naming the path and the fix, never a raw OSError."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent_fsm.actions.recover import RETRY_FIRST, RETRY_MAX, retry_delay
from agent_fsm.node.assets.render import render
from tests.helpers import World, make_world

ROOT = Path(__file__).resolve().parents[2]
CONFIG = 'name = "agent"\n[judgment]\ndeadline_seconds = 60\nsoak_seconds = 5\n'
can_mount = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                               reason="a read-only mount needs root and util-linux unshare")


def _node(tmp_path: Path, *, upgrading: bool) -> tuple[World, Path]:
    cfg = tmp_path / "config.toml"
    cfg.write_text(CONFIG)
    world = make_world(tmp_path / "root").installed("1.0.0")
    if upgrading:
        world.upgrading("2.0.0")
    return world, cfg


def _env(tmp_path: Path, restarts: int, **extra: str) -> dict[str, str]:
    """The child's environment: a stub systemctl (the process boundary) that answers `show`
    with the recovery unit's restart count and succeeds at everything else."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    stub = bindir / "systemctl"
    stub.write_text(f'#!/bin/sh\n[ "$1" = show ] && echo NRestarts={restarts}\nexit 0\n')
    stub.chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if k not in ("NOTIFY_SOCKET", "AGENT_FSM_CONFIG", "AGENT_FSM_RECOVERY")}
    return {**env, "PATH": f"{bindir}:{os.environ['PATH']}", **extra}


def _recover(world: World, cfg: Path, env: dict[str, str], *, read_only: bool = False,
             ) -> subprocess.CompletedProcess[str]:
    """Run `agent-fsm recover` in a process of its own; with `read_only`, in a mount namespace
    of its own where the state directory is a read-only bind mount of itself."""
    argv = [sys.executable, "-m", "agent_fsm", "--config", str(cfg), "--root", str(world.root),
            "recover"]
    if read_only:
        state = world.paths.state_dir
        argv = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                f'mount --bind "{state}" "{state}" && mount -o remount,bind,ro "{state}" '
                '&& exec "$@"', "sh", *argv]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=90)


class TestTheUnit:
    def test_the_recovery_unit_restarts_a_failed_recover_and_never_gives_up(
            self, world: World) -> None:
        """The recovery unit systemd runs restarts its `recover` when it fails
        (`Restart=on-failure`) with no start limit, and gives a try time for its longest wait."""
        world.installed("1.0.0")
        rendered = {a.path.name: a.content.decode()
                    for a in render(world.paths.releases_dir / "1.0.0", world.paths, "1.0.0")}
        unit = rendered["agent-recovery.service"].splitlines()
        assert "Restart=on-failure" in unit and "StartLimitIntervalSec=0" in unit
        timeout = next(int(ln.split("=")[1]) for ln in unit if ln.startswith("TimeoutStartSec="))
        assert timeout > RETRY_MAX + 60  # the wait, and the lock's (WAY_BACK_LOCK_WAIT)


class TestDelay:
    @pytest.mark.parametrize(("restarts", "delay"), [
        ("0", RETRY_FIRST), ("1", 2 * RETRY_FIRST), ("3", 8 * RETRY_FIRST), ("4", RETRY_MAX),
        ("1000", RETRY_MAX), ("", RETRY_MAX), ("many", RETRY_MAX)])
    def test_the_wait_grows_with_the_units_restarts_up_to_a_bound(
            self, world: World, restarts: str, delay: float) -> None:
        """The wait before a failed try exits doubles with each restart systemd counted, from
        2 s to at most 30 s; the bound when systemd cannot say."""
        world.systemd.shown["NRestarts"] = restarts
        assert retry_delay(world.node) == delay

    def test_without_a_node_the_wait_is_the_bound(self) -> None:
        """A try that could not even read its config waits the longest."""
        assert retry_delay(None) == RETRY_MAX


class TestExit:
    def test_nothing_to_roll_back_exits_0_at_once(self, tmp_path: Path) -> None:
        """Run by the recovery unit with no upgrade pending, `recover` says so and exits 0
        without waiting: systemd does not start it again."""
        world, cfg = _node(tmp_path, upgrading=False)
        proc = _recover(world, cfg, _env(tmp_path, 0, AGENT_FSM_RECOVERY="unit"))
        assert proc.returncode == 0, proc.stderr
        assert (proc.stdout, proc.stderr) == ("nothing to roll back: no upgrade is pending\n", "")

    def test_rolled_back_exits_0(self, tmp_path: Path) -> None:
        """Run by the recovery unit with an upgrade pending, `recover` rolls back and exits 0."""
        world, cfg = _node(tmp_path, upgrading=True)
        proc = _recover(world, cfg, _env(tmp_path, 0, AGENT_FSM_RECOVERY="unit"))
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("rolling back to last-good 1.0.0")

    @can_mount
    def test_read_only_state_dir_by_the_unit_waits_then_exits_non_zero(
            self, tmp_path: Path) -> None:
        """Run by the recovery unit on a read-only state dir, `recover` says in one line which
        file it could not open and what to do, that it is tried again, waits, and exits
        non-zero; nothing on disk changed."""
        world, cfg = _node(tmp_path, upgrading=True)
        before = world.paths.state_file.read_bytes()
        proc = _recover(world, cfg, _env(tmp_path, 1, AGENT_FSM_RECOVERY="unit"),
                        read_only=True)
        assert proc.returncode != 0
        lines = proc.stderr.splitlines()
        assert "Traceback" not in proc.stderr and len(lines) == 2, proc.stderr
        assert lines[0].startswith(f"agent-fsm: could not open the writers' lock "
                                   f"{world.paths.lock_file}: Read-only file system")
        assert "remount the file system of" in lines[0] and "[Errno" not in lines[0]
        assert lines[1] == ("agent-fsm: the rollback is not done; the recovery unit tries "
                            f"again in about {2 * RETRY_FIRST + 1:.0f}s")
        assert world.paths.state_file.read_bytes() == before

    @can_mount
    def test_read_only_state_dir_by_hand_is_one_line_at_once(self, tmp_path: Path) -> None:
        """Run by an operator on a read-only state dir, `recover` fails at once (exit 1) with
        the one line naming the writers' lock and the fix."""
        world, cfg = _node(tmp_path, upgrading=True)
        proc = _recover(world, cfg, _env(tmp_path, 0), read_only=True)
        assert proc.returncode == 1
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert f"{world.paths.lock_file}: Read-only file system; remount" in proc.stderr
