"""`doctor` finds what is wrong with a host and says what to do."""

from __future__ import annotations

from agent_fsm.node.runtime import signal
from agent_fsm.views.doctor.checks import Finding, doctor
from tests.helpers import World


def _by_check(findings: list[Finding]) -> dict[str, Finding]:
    return {f.check: f for f in findings}


class TestDoctor:
    def test_healthy_node_has_no_failures(self, world: World) -> None:
        """A freshly installed, settled node has no failing finding."""
        world.installed("1.0.0")
        findings = doctor(world.node, check_systemd=False)
        assert [f for f in findings if f.level == "fail"] == []
        assert _by_check(findings)["assets"].level == "ok"

    def test_stray_signal_and_open_gate_fail(self, world: World) -> None:
        """A signal with no upgrade in the state file, and a gate open beside it, are failures
        that say what to do."""
        world.installed("1.0.0")
        signal.write(world.paths.signal_file, signal.UpgradeSignal("1.0.0", "2.0.0", 1, 0, 0))
        found = _by_check(doctor(world.node, check_systemd=False))
        assert found["signal"].level == "fail" and "remove" in found["signal"].fix
        assert found["gate"].level == "fail"

    def test_loose_state_dir_fails(self, world: World) -> None:
        """A group-writable state directory is a failure with the chmod that fixes it."""
        world.installed("1.0.0")
        world.paths.state_dir.chmod(0o775)
        found = _by_check(doctor(world.node, check_systemd=False))
        assert found["state directory"].level == "fail"
        assert "chmod go-w" in found["state directory"].detail

    def test_drifted_assets_warn(self, world: World) -> None:
        """Assets edited by hand are a warning: the next start of the agent rewrites them."""
        world.installed("1.0.0")
        world.paths.agent_unit.write_text("# edited\n")
        found = _by_check(doctor(world.node, check_systemd=False))
        assert found["assets"].level == "warn" and str(world.paths.agent_unit) in found["assets"].detail

    def test_damaged_state_file_fails(self, world: World) -> None:
        """A damaged state file is reported, not raised."""
        world.installed("1.0.0")
        world.paths.state_file.write_text("{")
        found = _by_check(doctor(world.node, check_systemd=False))
        assert found["state file"].level == "fail" and "not valid JSON" in found["state file"].detail

    def test_an_operators_command_that_died_is_a_warning_the_agent_finishes(
            self, world: World) -> None:
        """An `install` killed half-way is an owed-effects warning whose fix says the running
        agent finishes it within 5 s: nothing to run by hand."""
        import pytest

        from tests.helpers import Crash, crash_at

        world.installed("1.0.0")
        world.add_release("2.0.0")
        world.node.controller.failpoint = crash_at("install", 3)
        with pytest.raises(Crash):
            world.node.controller.fire("install", release="2.0.0")
        found = _by_check(doctor(world.reopen().node, check_systemd=False))["owed effects"]
        assert found.level == "warn" and "install stopped after 3 of 7 effects" in found.detail
        assert "the running agent restarts agent.service within 5s" in found.fix


class TestCommand:
    def test_doctor_json_and_exit_code(self, world: World, tmp_path: object) -> None:
        """`doctor --json` lists findings with what to do; a failing check makes it exit 1."""
        import json
        import os
        import subprocess
        import sys
        from pathlib import Path

        world.installed("1.0.0")
        cfg = Path(str(tmp_path)) / "config.toml"
        cfg.write_text('name = "agent"\n')
        argv = [sys.executable, "-m", "agent_fsm", "--config", str(cfg), "--root",
                str(world.root), "doctor", "--json"]
        ok = subprocess.run(argv, capture_output=True, text=True, check=False, env=os.environ)
        findings = json.loads(ok.stdout)
        assert {f["check"] for f in findings} >= {"state file", "signal", "gate", "lock"}
        assert ok.returncode == (1 if any(f["level"] == "fail" for f in findings) else 0)
        world.paths.state_dir.chmod(0o777)
        bad = subprocess.run(argv, capture_output=True, text=True, check=False, env=os.environ)
        assert bad.returncode == 1
        fail = [f for f in json.loads(bad.stdout) if f["level"] == "fail"]
        assert any("chmod go-w" in f["detail"] for f in fail)
        human = subprocess.run(argv[:-1], capture_output=True, text=True, check=False)
        assert "FAIL" in human.stdout and "state directory" in human.stdout

    def test_a_config_typo_is_a_finding_with_its_line(self, world: World, tmp_path: object) -> None:
        """A key agent-fsm does not know, or a value out of range, is a failing `config` finding
        naming the key and its line, not an exit before any check; the other checks still run
        with the config as the daemon reads it."""
        import json
        import subprocess
        import sys
        from pathlib import Path

        world.installed("1.0.0")
        cfg = Path(str(tmp_path)) / "config.toml"
        for text, needle in (
                ('name = "agent"\n\n[judgment]\nsoak_secnds = 1\n', "`judgment.soak_secnds`"),
                ('name = "agent"\nhistory_limit = 0\n', "`history_limit`")):
            cfg.write_text(text)
            line = next(n for n, t in enumerate(text.splitlines(), 1) if "=" in t and
                        t.split("=")[0].strip() in needle)
            proc = subprocess.run([sys.executable, "-m", "agent_fsm", "--config", str(cfg),
                                   "--root", str(world.root), "doctor", "--json"],
                                  capture_output=True, text=True, check=False, timeout=60)
            assert proc.returncode == 1, proc.stderr
            findings = json.loads(proc.stdout)
            (config,) = [f for f in findings if f["check"] == "config"]
            assert config["level"] == "fail" and needle in config["detail"]
            assert f"(line {line})" in config["detail"] and f"line {line}" in config["fix"]
            assert {f["check"] for f in findings} >= {"state file", "signal", "gate"}
