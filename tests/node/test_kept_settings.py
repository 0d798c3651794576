"""The last-good recovers with its own settings: a config made wrong mid-upgrade (a value out of
range, a file that is not TOML) never stops the way back. `recover` and the last-good's daemon on
a signal's way back run with the settings kept when the last-good was promoted, say so in their
log and in `status`; every operator command, and the daemon anywhere else, still refuses it."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_fsm.actions.releases.packing import pack
from agent_fsm.node import config as config_mod
from agent_fsm.node.assets import kept
from agent_fsm.node.channel_config import ChannelConfig
from agent_fsm.node.check_config import HttpCheck
from agent_fsm.node.config import Config, Judgment, WorkloadConfig
from agent_fsm.node.config_fallback import way_back_config
from agent_fsm.node.hook_config import HookConfig
from agent_fsm.node.state.document_file import Kind
from agent_fsm.node.store_config import StoreConfig
from tests.helpers import World, env_with_stub_systemctl, make_world, one_line

GOOD = 'name = "agent"\n[judgment]\ndeadline_seconds = 60\nsoak_seconds = 5\n'
WRONG = {
    "out of range": 'name = "agent"\n[judgment]\ndeadline_seconds = -1\nsoak_seconds = 5\n',
    "not TOML": 'name = "agent"\n[judgment\ndeadline_seconds = 60\n',
}
SETTINGS = Config(name="agent", history_limit=50, publish_command=("/usr/bin/publish", "-q"),
                  judgment=Judgment(deadline_seconds=60, soak_seconds=5, max_attempts=3,
                                    checks=(("/bin/true",), ("/bin/sh", "-c", "exit 0"))))


def _node(tmp_path: Path) -> tuple[World, Path]:
    world = make_world(tmp_path / "root", SETTINGS)
    world.installed("1.0.0")
    cfg = tmp_path / "config.toml"
    cfg.write_text(GOOD)
    return world, cfg


def _env(tmp_path: Path) -> dict[str, str]:
    """A systemctl stub that succeeds and notes each call in `tmp_path/systemctl.log`."""
    env = env_with_stub_systemctl(tmp_path)
    stub = tmp_path / "bin" / "systemctl"
    stub.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path / "systemctl.log"}\nexit 0\n')
    return env


def _run(world: World, cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent_fsm", "--config", str(cfg), "--root",
                           str(world.root), *args], env=_env(world.root.parent),
                          capture_output=True, text=True, timeout=60, check=False)


class TestKept:
    def test_promotion_keeps_every_setting(self, tmp_path: Path) -> None:
        """Promoting a release keeps the host's settings beside its assets, and they read back
        as the config they were kept from."""
        world, _ = _node(tmp_path)
        copy = kept.read(world.paths.last_good_assets)
        assert copy is not None and copy.settings is not None
        assert config_mod.parse(copy.settings, Path("kept")) == SETTINGS._replace(
            source=Path("kept"))

    def testevery_setting_off_its_default_reads_back(self, tmp_path: Path) -> None:
        """Every setting the operator may write, each off its default, is kept with the
        last-good and reads back as it was: the way back never runs with a default instead."""
        off = every_setting_off_its_default()
        world = make_world(tmp_path / "root", off).installed("1.0.0")
        copy = kept.read(world.paths.last_good_assets)
        assert copy is not None and copy.settings is not None
        assert config_mod.parse(copy.settings, Path("kept")) == off._replace(source=Path("kept"))

    def test_a_copy_without_settings_still_holds_assets(self, tmp_path: Path) -> None:
        """A copy kept before settings were (or by an older agent-fsm) is still read, its
        assets usable: only the fallback is missing."""
        world, _ = _node(tmp_path)
        _drop_settings(world)
        copy = kept.read(world.paths.last_good_assets)
        assert copy is not None and copy.settings is None and copy.fits(world.paths)


def every_setting_off_its_default() -> Config:
    """A config whose every setting differs from its default (checked, field by field), each
    command it names a program of its own."""
    off = Config(
        name="agent", state_dir=Path("/srv/agent"), lib_dir=Path("/srv/lib"),
        unit_dir=Path("/srv/units"), run_dir=Path("/run/agent"), inhibitor_dir=Path("/run/inh"),
        python=Path(sys.executable), allowed_signers=Path("/etc/agent/signers"), history_limit=7,
        publish_command=("/usr/bin/publish", "-q"), publish_give_up_seconds=90.0,
        systemctl=("/usr/bin/systemctl", "--quiet"), podman=("/usr/bin/podman", "--root", "/x"),
        bin_link=None,
        judgment=Judgment(deadline_seconds=60.0, soak_seconds=0.0, max_attempts=5,
                          checks=(("/bin/true",), HttpCheck("http://127.0.0.1:8080/h", 204, 2.0)),
                          restart_seconds=0.5),
        hooks=HookConfig(before={"begin_upgrade": ("/usr/local/sbin/drain",)},
                         after={"recovered": ("/usr/local/sbin/undrain", "-x")},
                         timeout_seconds=9.0),
        workload=WorkloadConfig(user="nobody", group=65534, environment=(("A", "b"),),
                                writable_paths=(Path("/srv/data"),), identifier="agent-work"),
        store=StoreConfig(max_release_bytes=1 << 30, max_release_files=5000,
                          max_file_bytes=1 << 20),
        channel=ChannelConfig(url="https://updates.example.com/agent/stable", name="beta",
                              root=Path("/etc/agent/root.json"), ca=Path("/etc/agent/ca.pem"),
                              window="Mon..Fri 02:00", spread_seconds=60.0, timeout_seconds=9.0,
                              download_seconds=600.0, machine_id=Path("/srv/machine-id")))
    for record, default in ((off, Config()), (off.judgment, Judgment()), (off.hooks, HookConfig()),
                            (off.workload, WorkloadConfig()), (off.store, StoreConfig()),
                            (off.channel, ChannelConfig())):
        same = [f for f in record._fields if getattr(record, f) == getattr(default, f)
                and f not in ("source", "fallback")]
        assert not same, f"still at their defaults: {same}"
    return off


def _drop_settings(world: World) -> None:
    where = world.paths.last_good_assets
    body = json.loads(where.read_bytes())
    for key in ("checksum", "kind", "schema", "settings"):
        body.pop(key)
    where.write_bytes(Kind(*kept.KIND).encode(body))


class TestWayBack:
    @pytest.mark.parametrize("wrong", sorted(WRONG))
    def test_recover_rolls_back_with_the_kept_settings(self, tmp_path: Path,
                                                       wrong: str) -> None:
        """Mid-upgrade, with the config wrong, `recover` rolls back to the last-good (exit 0)
        through the kept settings (the kept unit name, restarted), and says so on stderr."""
        world, cfg = _node(tmp_path)
        world.upgrading("2.0.0")
        cfg.write_text(WRONG[wrong])
        proc = _run(world, cfg, "recover")
        assert proc.returncode == 0, proc.stderr
        assert "the way back goes on with last-good 1.0.0's settings" in proc.stderr
        assert "operator commands refuse it" in proc.stderr
        world = world.reopen()
        assert world.node.store.read().state == "recovering"
        assert world.node.releases.selected() == "1.0.0"
        assert "restart --no-block -- agent.service" in (tmp_path / "systemctl.log").read_text()

    def test_without_kept_settings_recover_refuses_saying_why(self, tmp_path: Path) -> None:
        """With no settings kept (a last-good promoted by an older agent-fsm), `recover`
        refuses the wrong config in one line that says none were kept, and changes nothing."""
        world, cfg = _node(tmp_path)
        world.upgrading("2.0.0")
        _drop_settings(world)
        cfg.write_text(WRONG["out of range"])
        proc = _run(world, cfg, "recover")
        line = one_line(proc)
        assert proc.returncode == 1
        assert "`judgment.deadline_seconds` is -1" in line and "no settings of the last-good " \
            "are kept" in line
        assert world.reopen().node.store.read().state == "candidate_running"

    def test_the_daemon_finishes_the_rollback_with_the_kept_settings(
            self, tmp_path: Path) -> None:
        """In `recovering`, the last-good's daemon started with a wrong config clears the
        signal, opens the gate with the kept settings, and stops cleanly."""
        world, cfg = _node(tmp_path)
        world.upgrading("2.0.0")
        world.node.controller.fire("recover")
        world.paths.gate_file.unlink(missing_ok=True)  # closed, as at a start
        cfg.write_text(WRONG["out of range"])
        daemon = subprocess.Popen(
            [sys.executable, "-m", "agent_fsm", "--config", str(cfg), "--root",
             str(world.root), "daemon"], env=_env(tmp_path), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        try:
            end = time.monotonic() + 30
            while not world.paths.gate_file.exists() and daemon.poll() is None \
                    and time.monotonic() < end:
                time.sleep(0.05)
            assert world.paths.gate_file.exists(), daemon.communicate(timeout=5)[1]
            daemon.send_signal(signal.SIGTERM)
            _, err = daemon.communicate(timeout=30)
        finally:
            daemon.kill()
        assert daemon.returncode == 0, err
        assert "the way back goes on with last-good 1.0.0's settings" in err
        doc = world.reopen().node.store.read()
        assert (doc.state, world.node.effectors.signal()) == ("converged", None)

    def test_the_daemon_refuses_it_off_the_way_back(self, tmp_path: Path) -> None:
        """Converged, the daemon refuses the wrong config as it did (exit 1, the file's error
        in one line): the kept settings serve the way back only."""
        world, cfg = _node(tmp_path)
        cfg.write_text(WRONG["out of range"])
        proc = _run(world, cfg, "daemon")
        assert proc.returncode == 1
        assert one_line(proc).endswith(
            "`judgment.deadline_seconds` is -1; expected a finite number above 0, at most 604800")


class TestFromTheRelease:
    def test_recover_finds_the_settings_beside_the_release_it_runs_from(
            self, tmp_path: Path) -> None:
        """With the config not TOML at all (no state dir named) and a state dir other than
        the default, the last-good's own bin/agent-fsm finds the kept settings in the state dir
        it runs from and rolls back."""
        config = SETTINGS._replace(state_dir=Path("/srv/agent"))
        world = make_world(tmp_path / "root", config)
        shutil.copytree(pack("1.0.0", tmp_path / "packed"), world.paths.releases_dir / "1.0.0",
                        symlinks=True)
        world.record_digest("1.0.0")
        world.installed("1.0.0")
        world.upgrading("2.0.0")
        cfg = tmp_path / "config.toml"
        cfg.write_text(WRONG["not TOML"])
        launcher = world.paths.releases_dir / "1.0.0" / "bin" / "agent-fsm"
        proc = subprocess.run([str(launcher), "--config", str(cfg), "--root", str(world.root),
                               "recover"], env=_env(tmp_path), capture_output=True, text=True,
                              timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
        assert f"kept in {world.paths.last_good_assets}" in proc.stderr
        assert world.reopen().node.store.read().state == "recovering"


class TestOperators:
    def test_an_operator_command_refuses_the_wrong_config(self, tmp_path: Path) -> None:
        """`hold` (as every operator command) refuses the wrong config in one line, the kept
        settings notwithstanding."""
        world, cfg = _node(tmp_path)
        cfg.write_text(WRONG["out of range"])
        proc = _run(world, cfg, "hold", "--reason", "maintenance")
        assert proc.returncode == 1 and "`judgment.deadline_seconds` is -1" in one_line(proc)
        assert not world.paths.hold_file.exists()

    def test_status_shows_the_fallback_until_the_config_is_fixed(self, tmp_path: Path) -> None:
        """`status --json` names the live file's error and the kept settings used instead, and
        the human view says so in a line; both are gone once the file is fixed."""
        world, cfg = _node(tmp_path)
        cfg.write_text(WRONG["not TOML"])
        data = json.loads(_run(world, cfg, "status", "--json").stdout)
        fallback = data["config_fallback"]
        assert fallback["version"] == "1.0.0" and "is not valid TOML" in fallback["error"]
        assert fallback["kept"] == str(world.paths.last_good_assets)
        human = _run(world, cfg, "status").stdout
        assert "the way back uses last-good 1.0.0's settings" in " ".join(human.split())
        cfg.write_text(GOOD)
        assert json.loads(_run(world, cfg, "status", "--json").stdout)["config_fallback"] is None


class TestKeptCurrent:
    def test_a_fallback_runs_the_workload_as_the_user_last_read_valid(
            self, tmp_path: Path) -> None:
        """The operator sets `user = "nobody"` (valid, read by a root command), then breaks the
        config mid-upgrade: the way back runs the workload as nobody, never as root again."""
        world, cfg = _node(tmp_path)
        assert kept.read(world.paths.last_good_assets).settings["workload"].get("user") is None
        cfg.write_text(GOOD + '[workload]\nuser = "nobody"\n')
        assert _run(world, cfg, "history").returncode == 0
        # The operator's `upgrade` reads the file as it is now, as the command does.
        world = make_world(world.root, config_mod.load(cfg, world.root), world.systemd,
                           world.publisher, world.clock)
        world.upgrading("2.0.0")
        cfg.write_text(WRONG["not TOML"])
        config = way_back_config(cfg, world.root, quiet=True)
        assert config.fallback is not None
        assert config.workload.user == "nobody"

    def test_a_candidates_run_keeps_nothing(self, tmp_path: Path) -> None:
        """While an upgrade is pending, a config read valid is not kept: only the last-good's
        code, settled, writes the settings its way back runs with."""
        world, cfg = _node(tmp_path)
        world.upgrading("2.0.0")
        before = world.paths.last_good_assets.read_bytes()
        cfg.write_text(GOOD + '[workload]\nuser = "nobody"\n')
        assert _run(world, cfg, "history").returncode == 0
        assert world.paths.last_good_assets.read_bytes() == before
