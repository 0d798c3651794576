"""A config written for a newer agent-fsm (the candidate's keys) never stops the way back: the
last-good's `recover` and `daemon` ignore keys they do not know, saying so; every command an
operator runs still refuses them."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import World, env_with_stub_systemctl, make_world

NEWER = ('name = "agent"\nfuture_key = "from a newer agent-fsm"\n'
         "[judgment]\ndeadline_seconds = 1\nsoak_seconds = 0\nfuture_check = true\n")


def _node(tmp_path: Path) -> tuple[World, Path]:
    world = make_world(tmp_path / "root")
    world.installed("1.0.0")
    cfg = tmp_path / "config.toml"
    cfg.write_text(NEWER)
    return world, cfg


def _cli(world: World, cfg: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "agent_fsm", "--config", str(cfg), "--root",
                             str(world.root), *args], env=env_with_stub_systemctl(world.root.parent),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


class TestNewerConfig:
    def test_an_operator_command_refuses_an_unknown_key(self, tmp_path: Path) -> None:
        """`status` (as every operator command) refuses the unknown key: exit 1, one line."""
        world, cfg = _node(tmp_path)
        proc = _cli(world, cfg, "status", "--json")
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 1 and "unknown key `future_key`" in err
        assert len(err.strip().splitlines()) == 1

    def test_recover_rolls_back_past_keys_it_does_not_know(self, tmp_path: Path) -> None:
        """Mid-upgrade, with the config naming keys of a newer version, `recover` still rolls
        back to the last-good (exit 0) and names the keys it ignored."""
        world, cfg = _node(tmp_path)
        world.upgrading("2.0.0")
        proc = _cli(world, cfg, "recover")
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "`future_key`" in err and "`judgment.future_check`" in err and "ignoring" in err
        assert world.node.store.read().state == "recovering"
        assert world.node.releases.selected() == "1.0.0"

    def test_the_daemon_starts_past_keys_it_does_not_know(self, tmp_path: Path) -> None:
        """The last-good's daemon starts with that config, opens the gate, and stops cleanly."""
        world, cfg = _node(tmp_path)
        world.paths.gate_file.unlink()  # closed, as at boot: the daemon opens it
        daemon = _cli(world, cfg, "daemon")
        try:
            deadline = time.monotonic() + 30
            while not world.node.effectors.gate.is_open() and daemon.poll() is None \
                    and time.monotonic() < deadline:
                time.sleep(0.05)
            assert world.node.effectors.gate.is_open(), daemon.stderr.read() if daemon.poll() else ""
            daemon.send_signal(signal.SIGTERM)
            _, err = daemon.communicate(timeout=30)
        finally:
            daemon.kill()
        assert daemon.returncode == 0, err
        assert "ignoring unknown key `future_key`" in err
