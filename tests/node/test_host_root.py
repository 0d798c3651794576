"""Driving a host from a container: the config's host path under --root, and `systemctl`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_fsm.errors import ConfigError, SystemdError
from agent_fsm.node import config as config_mod
from agent_fsm.node.config import Config
from agent_fsm.system.systemd import Systemctl
from agent_fsm.views.doctor.checks import doctor
from agent_fsm.wiring import open_node
from tests.helpers import make_world

REPO = Path(__file__).resolve().parents[2]


def _cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != config_mod.CONFIG_ENV}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "agent_fsm", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=60, check=False)


def _stub(path: Path, log: Path, out: str = "") -> Path:
    path.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$*\" >> {log}\nprintf '{out}'\n")
    path.chmod(0o755)
    return path


class TestConfigUnderRoot:
    def test_config_below_the_root_is_named_by_its_host_path(self, tmp_path: Path) -> None:
        """`--root R --config R/etc/agent-fsm/config.toml`: the units and the script name
        /etc/agent-fsm/config.toml, and the root appears in none of them."""
        root = tmp_path / "host"
        cfg = root / "etc" / "agent-fsm" / "config.toml"
        cfg.parent.mkdir(parents=True)
        cfg.write_text('name = "agent"\n')
        world = make_world(root, config_mod.load(cfg, root)).installed("1.0.0")
        assert world.paths.host_config == Path("/etc/agent-fsm/config.toml")
        for name, content in world.assets_on_disk().items():
            assert content is not None and str(root).encode() not in content, name
            if name != "agent-recovery.service":  # it names the script, not the config
                assert b"--config /etc/agent-fsm/config.toml " in content, name

    def test_relative_root_and_unnormalized_config_path(self, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
        """A relative --root and a config path with `..` in it still give the host path."""
        monkeypatch.chdir(tmp_path)
        paths = open_node(Config(source=tmp_path / "host" / "x" / ".." / "agent.toml"),
                          Path("host")).paths
        assert paths.host_config == Path("/agent.toml")

    def test_config_outside_the_root_is_named_as_given_and_doctor_warns(self,
                                                                        tmp_path: Path) -> None:
        """A config outside --root is named as it is (the host must have it there), and doctor
        says so with the --config that would name the host's own file."""
        cfg = tmp_path / "config.toml"
        world = make_world(tmp_path / "host", Config(name="agent", source=cfg))
        world.installed("1.0.0")
        assert world.paths.host_config == cfg
        found = [f for f in doctor(world.node, check_systemd=False) if f.check == "config path"]
        assert len(found) == 1 and found[0].level == "warn"
        assert f"--config {tmp_path / 'host'}/etc/agent-fsm/config.toml" in found[0].fix

    def test_no_doctor_warning_for_a_config_below_the_root(self, tmp_path: Path) -> None:
        """doctor does not warn about a config read below --root."""
        below = make_world(tmp_path / "host",
                           Config(name="agent", source=tmp_path / "host" / "c.toml"))
        found = doctor(below.node, check_systemd=False)
        assert [f for f in found if f.check == "config path"] == []

    def test_default_config_under_root_is_the_hosts(self, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
        """Without --config or $AGENT_FSM_CONFIG, --root R reads R/etc/agent-fsm/config.toml
        (the host's file, which its units name), not the container's own."""
        monkeypatch.delenv(config_mod.CONFIG_ENV, raising=False)
        root = tmp_path / "host"
        cfg = root / "etc" / "agent-fsm" / "config.toml"
        cfg.parent.mkdir(parents=True)
        cfg.write_text('name = "hostagent"\n')
        loaded = config_mod.load(None, root)
        assert (loaded.name, loaded.source) == ("hostagent", cfg)
        status = json.loads(_cli("--root", str(root), "status", "--json").stdout)
        assert status["name"] == "hostagent"


class TestSystemctlKey:
    def test_default_is_systemctl(self) -> None:
        """Without the key, every systemctl call runs `systemctl`."""
        assert config_mod.parse({}, Path("/c.toml")).systemctl == ("systemctl",)

    @pytest.mark.parametrize("value", [[], "systemctl", [1], ["systemctl", None], ["bin/systemctl"]])
    def test_bad_prefix_is_refused_naming_it(self, value: object) -> None:
        """An empty list, a string, a non-string or a relative program is a config error naming
        the key."""
        with pytest.raises(ConfigError, match=r"`systemctl` is .*expected a"):
            config_mod.parse({"systemctl": value}, Path("/c.toml"))

    def test_every_call_starts_with_the_prefix(self, tmp_path: Path) -> None:
        """The node's effects call systemctl through the configured argv prefix."""
        log = tmp_path / "argv"
        stub = _stub(tmp_path / "wrapper", log)
        node = open_node(Config(systemctl=(str(stub), "--host", "x")), tmp_path / "root")
        node.effectors.systemd.daemon_reload()
        node.effectors.systemd.restart("a.service")
        assert log.read_text().splitlines() == [
            "--host x daemon-reload", "--host x restart --no-block -- a.service"]

    def test_doctor_reads_the_version_through_the_prefix(self, tmp_path: Path) -> None:
        """doctor asks the configured prefix for systemd's version, and names a missing one."""
        log = tmp_path / "argv"
        stub = _stub(tmp_path / "wrapper", log, "systemd 252 (252.38-1)\\n")
        world = make_world(tmp_path / "root", Config(name="agent", systemctl=(str(stub), "-q")))
        found = {f.check: f for f in doctor(world.node)}
        assert (found["systemd"].level, found["systemd"].detail) == ("ok", "systemd 252")
        calls = log.read_text().splitlines()
        assert calls[0] == "-q --version"  # then the units' state, through the same prefix
        assert all(c.startswith("-q ") for c in calls), calls
        missing = make_world(tmp_path / "other", Config(name="agent", systemctl=("no-such-ctl",)))
        found = {f.check: f for f in doctor(missing.node)}
        assert found["systemd"].level == "fail" and "no-such-ctl" in found["systemd"].detail

    def test_a_call_systemctl_ignores_in_a_chroot_is_an_error(self, tmp_path: Path) -> None:
        """systemctl that exits 0 saying it ignores the command (it thinks it runs in a chroot,
        as with podman --pid=host) is an error that says how to fix it, not a silent success."""
        stub = tmp_path / "systemctl"
        stub.write_text("#!/bin/sh\necho \"Running in chroot, ignoring command '$1'\" >&2\n")
        stub.chmod(0o755)
        with pytest.raises(SystemdError, match=r"did nothing.*SYSTEMD_IGNORE_CHROOT=1"):
            Systemctl((str(stub),)).restart("agent.service")
