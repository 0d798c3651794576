"""`status` and `metrics` show the workload from the daemon's record, and never a dead one as
running."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent_fsm.node import config as config_mod
from agent_fsm.node.runtime import workload as record
from agent_fsm.views.doctor.checks import doctor
from tests.helpers import World, make_world
from tests.views.test_status import cli


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text('name = "agent"\n[workload]\nuser = "nobody"\n'
                    'writable_paths = ["/var/lib/myagent"]\n')
    return path


@pytest.fixture
def node_world(tmp_path: Path, cfg: Path) -> World:
    world = make_world(tmp_path / "root", config_mod.load(cfg))
    release = world.add_release("1.0.0")
    (release / "release.toml").write_text('version = "1.0.0"\nworkload = ["/bin/myagent"]\n')
    world.record_digest("1.0.0")
    world.installed("1.0.0")
    return world


def _write(world: World, pid: int, last: record.Exit | None = None) -> None:
    record.write(world.paths, record.Record("1.0.0", ("/bin/myagent", "--serve"), "nobody",
                                            True, pid, "2026-12-01T10:00:00Z", 2, last,
                                            os.getpid()))


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _metrics(world: World, cfg: Path) -> dict[str, float]:
    text = cli(world, cfg, "metrics").stdout
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name.startswith("agent_fsm_workload")}


class TestStatus:
    def test_json_and_human_show_a_running_workload(self, node_world: World, cfg: Path) -> None:
        """`status --json` has the workload running with its pid, user, restarts and last
        exit; the human view says the same in words, without Python's None."""
        _write(node_world, os.getpid(), record.Exit(None, "SIGKILL", "2026-12-01T09:59:00Z"))
        work = json.loads(cli(node_world, cfg, "status", "--json").stdout)["workload"]
        assert {k: work[k] for k in ("command", "running", "pid", "since", "restarts",
                                     "last_exit", "user")} == {
            "command": ["/bin/myagent", "--serve"], "running": True, "pid": os.getpid(),
            "since": "2026-12-01T10:00:00Z", "restarts": 2, "user": "nobody",
            "last_exit": {"code": None, "signal": "SIGKILL", "time": "2026-12-01T09:59:00Z"}}
        human = cli(node_world, cfg, "status").stdout
        assert f"running as nobody, pid {os.getpid()}, since 2026-12-01T10:00:00Z" in human
        assert "last killed by SIGKILL at 2026-12-01T09:59:00Z" in human
        assert "None" not in human.split("workload", 1)[1].split("\n")[0]

    def test_a_dead_workload_is_never_shown_running(self, node_world: World, cfg: Path) -> None:
        """A record whose pid is dead is shown as not running, in JSON, words and metrics."""
        _write(node_world, _dead_pid())
        work = json.loads(cli(node_world, cfg, "status", "--json").stdout)["workload"]
        assert (work["running"], work["pid"]) == (False, None)
        human = cli(node_world, cfg, "status").stdout
        assert "workload     not running (runs as nobody)" in human
        assert "its workload is not running (its log: journalctl -t agent" in human
        assert _metrics(node_world, cfg)["agent_fsm_workload_running"] == 0.0

    def test_writable_paths_not_yet_in_the_unit_are_named(self, node_world: World,
                                                           cfg: Path) -> None:
        """Writable paths the config grants but the agent unit on disk lacks are named, with
        when they take effect; once the unit has them, nothing is said."""
        node_world.paths.agent_unit.write_text("[Service]\nExecStart=/bin/true\n")
        work = json.loads(cli(node_world, cfg, "status", "--json").stdout)["workload"]
        assert work["writable_paths"] == {"configured": ["/var/lib/myagent"], "in_unit": False}
        assert "writable paths /var/lib/myagent are not in the agent unit on disk yet" in \
            cli(node_world, cfg, "status").stdout
        node_world.installed("1.0.0")  # install writes every asset
        assert json.loads(cli(node_world, cfg, "status", "--json").stdout)["workload"][
            "writable_paths"]["in_unit"] is True


class TestMetrics:
    def test_running_and_restarts(self, node_world: World, cfg: Path) -> None:
        """`metrics` has agent_fsm_workload_running (1 while it runs) and its restarts."""
        _write(node_world, os.getpid())
        assert _metrics(node_world, cfg) == {"agent_fsm_workload_running": 1.0,
                                             "agent_fsm_workload_restarts_total": 2.0}


class TestDoctor:
    def _workload_findings(self, tmp_path: Path, table: str) -> list[tuple[str, str]]:
        cfg = tmp_path / "doctor.toml"
        cfg.write_text('name = "agent"\n' + table)
        world = make_world(tmp_path / "doctor-root", config_mod.load(cfg))
        release = world.add_release("1.0.0")
        (release / "release.toml").write_text('version = "1.0.0"\nworkload = ["/bin/myagent"]\n')
        world.record_digest("1.0.0")
        world.installed("1.0.0")
        return [(f.level, f.detail) for f in doctor(world.node, check_systemd=False)
                if f.check == "workload"]

    def test_root_by_default_is_a_warning(self, tmp_path: Path) -> None:
        """Without `[workload] user`, doctor warns that the workload runs as root."""
        assert self._workload_findings(tmp_path, "") == [
            ("warn", "the workload runs as root (the default)")]

    def test_the_configured_user_is_named(self, tmp_path: Path) -> None:
        """With a user, doctor names it with its ids, and warns of a writable path missing."""
        found = self._workload_findings(
            tmp_path, '[workload]\nuser = "nobody"\nwritable_paths = ["/nonexistent-data"]\n')
        assert found[0] == ("ok", "the workload runs as nobody (uid 65534, gid 65534)")
        assert found[1][0] == "warn" and "/nonexistent-data does not exist" in found[1][1]

    def test_a_missing_user_fails(self, tmp_path: Path) -> None:
        """A user that does not exist is a failure that names it."""
        found = self._workload_findings(tmp_path, '[workload]\nuser = "no-such-agent-user"\n')
        assert found[0][0] == "fail" and "'no-such-agent-user' does not exist" in found[0][1]
