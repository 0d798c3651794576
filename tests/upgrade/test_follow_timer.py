"""The follow timer on a node (real files, systemctl faked): written, enabled and started at
install and at the agent's start once its gate is open, left alone when it is as it should be,
and removed when the config names no channel."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from agent_fsm.actions.operations import install
from agent_fsm.agent.daemon import Daemon, Waker
from agent_fsm.node.assets import follow_units
from agent_fsm.node.channel_config import ChannelConfig
from agent_fsm.node.config import Config
from agent_fsm.system.notify import Notifier
from agent_fsm.upgrade import follow_timer
from tests.helpers import DEFAULT_CONFIG, World, make_world

URL = "https://updates.example.test/stable"
TIMER, SERVICE = "agent-follow.timer", "agent-follow.service"


def _following(config: Config = DEFAULT_CONFIG, **channel: object) -> Config:
    return config._replace(channel=ChannelConfig(url=URL, **channel))  # type: ignore[arg-type]


def _installed(tmp_path: Path, config: Config) -> World:
    world = make_world(tmp_path / "root", config)
    world.add_release("1.0.0")
    world.systemd.calls.clear()
    install(world.node, "1.0.0")
    return world


def _timer_calls(world: World) -> list[tuple[str, str]]:
    return [c for c in world.systemd.calls if c[1] in (TIMER, SERVICE) or c[0] == "daemon-reload"]


class ReadyStops(Notifier):
    """The daemon's notifier: READY=1 ends the run (as a stop right after it would)."""

    def __init__(self, waker: Waker) -> None:
        super().__init__("")
        self.waker = waker

    def ready(self, status: str) -> bool:
        self.waker.stop = True
        return True


class TestWritten:
    def test_install_writes_enables_and_starts_the_timer(self, tmp_path: Path) -> None:
        """With a `[channel] url`, install writes both units (the window and the spread in the
        timer), reloads systemd, enables the timer and starts it."""
        world = _installed(tmp_path, _following(window="Mon..Fri 02:00", spread_seconds=600))
        timer = world.paths.follow_timer.read_text()
        assert "OnCalendar=Mon..Fri 02:00\n" in timer and "RandomizedDelaySec=600\n" in timer
        assert "Persistent" not in timer.replace("No Persistent=", "")
        service = world.paths.follow_service.read_text()
        selected = world.node.config.state_dir / "selected"
        assert f"ExecStart={selected}/bin/agent-fsm --config " in service
        assert "SuccessExitStatus=3 4\n" in service
        assert world.systemd.calls[-2:] == [("enable", TIMER), ("restart", TIMER)]
        assert world.systemd.calls[-3] == ("daemon-reload", "")  # the timer's own, after it

    def test_systemd_is_reloaded_after_the_timer_is_written(self, tmp_path: Path) -> None:
        """The reload that precedes the timer's enable sees both files on disk."""
        world = make_world(tmp_path / "root", _following())
        world.add_release("1.0.0")
        seen: list[tuple[str, bool]] = []
        world.systemd.on_call = lambda verb, unit: seen.append(
            (verb, world.paths.follow_timer.exists() and world.paths.follow_service.exists()))
        install(world.node, "1.0.0")
        verbs = [v for v, _ in seen]
        enable = len(verbs) - 1 - verbs[::-1].index("enable")
        assert ("daemon-reload", True) in seen[:enable]

    def test_the_service_is_bounded_by_a_whole_follow(self, tmp_path: Path) -> None:
        """TimeoutStartSec= covers the download and every attempt of the judgment it waits for."""
        config = _following(download_seconds=7200)
        world = _installed(tmp_path, config)
        line = next(x for x in world.paths.follow_service.read_text().splitlines()
                    if x.startswith("TimeoutStartSec="))
        j = config.judgment
        assert int(line.split("=")[1]) > 7200 + (j.deadline_seconds + j.soak_seconds) * j.max_attempts
        assert int(line.split("=")[1]) == follow_units.follow_seconds(config)

    def test_a_start_that_finds_it_in_place_only_asks(self, tmp_path: Path) -> None:
        """Files as rendered, the timer enabled and active: one `show`, no reload, no start."""
        world = _installed(tmp_path, _following())
        world.systemd.calls.clear()
        world.systemd.shown_for[TIMER] = {"ActiveState": "active", "UnitFileState": "enabled"}
        assert follow_timer.keep(world.node.effectors) is None
        assert world.systemd.calls == [("show", TIMER)]

    def test_a_stopped_timer_is_started_again(self, tmp_path: Path) -> None:
        """Files in place but the timer inactive (stopped by hand, a failed start): started."""
        world = _installed(tmp_path, _following())
        world.systemd.calls.clear()
        world.systemd.shown_for[TIMER] = {"ActiveState": "inactive", "UnitFileState": "enabled"}
        follow_timer.keep(world.node.effectors)
        assert world.systemd.calls == [("show", TIMER), ("start", TIMER)]

    def test_the_agents_start_writes_it_once_its_gate_is_open(self, tmp_path: Path,
                                                              waker: Waker) -> None:
        """A channel configured after install: the daemon's next start writes and starts the
        timer, after READY=1 (the gate open)."""
        world = make_world(tmp_path / "root", DEFAULT_CONFIG).installed("1.0.0")
        assert not world.paths.follow_timer.exists()
        world = make_world(world.root, _following(), world.systemd, world.publisher, world.clock)
        world.systemd.calls.clear()
        assert Daemon(world.node, ReadyStops(waker), waker).run() == 0
        assert world.paths.follow_timer.exists() and world.paths.follow_service.exists()
        assert ("restart", TIMER) in world.systemd.calls

    def test_a_failing_systemctl_does_not_fail_install(self, tmp_path: Path) -> None:
        """systemctl failing for the timer: install still installs, and says so."""
        world = make_world(tmp_path / "root", _following())
        world.add_release("1.0.0")
        world.systemd.on_call = lambda verb, unit: _fail_for_timer(verb, unit)
        done = install(world.node, "1.0.0")
        assert done.state == "converged"
        assert "the follow timer could not be written" in done.message

    @pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
    def test_both_units_verify_clean(self, tmp_path: Path) -> None:
        """`systemd-analyze verify` says nothing of the rendered service and timer."""
        world = _installed(tmp_path, _following(window="*:*:0/5", spread_seconds=0))
        stub = world.paths.selected / "bin" / "agent-fsm"
        stub.parent.mkdir(parents=True, exist_ok=True)
        stub.write_text("#!/bin/sh\nexit 0\n")
        stub.chmod(0o755)
        units = tmp_path / "units"
        units.mkdir()
        for p in (world.paths.follow_service, world.paths.follow_timer):
            text = p.read_text().replace(str(world.node.config.state_dir / "selected"),
                                         str(world.paths.selected))
            (units / p.name).write_text(text)
        done = subprocess.run(["systemd-analyze", "verify", "--man=no", TIMER, SERVICE],
                              capture_output=True, text=True, check=False, cwd=units, timeout=60)
        assert (done.returncode, done.stderr) == (0, "")


def _fail_for_timer(verb: str, unit: str) -> None:
    from agent_fsm.errors import SystemdError

    if unit == TIMER:
        raise SystemdError(f"`systemctl {verb} {unit}` exited 1: injected failure")


class TestRemoved:
    def test_a_config_without_a_channel_removes_the_timer(self, tmp_path: Path) -> None:
        """The channel taken out of the config: the timer is stopped and disabled, both files
        deleted, systemd reloaded."""
        world = _installed(tmp_path, _following())
        world = make_world(world.root, DEFAULT_CONFIG, world.systemd, world.publisher, world.clock)
        world.systemd.calls.clear()
        assert follow_timer.keep(world.node.effectors) is not None
        assert not world.paths.follow_timer.exists() and not world.paths.follow_service.exists()
        assert world.systemd.calls == [("disable", TIMER), ("daemon-reload", "")]

    def test_without_a_channel_and_no_timer_nothing_is_asked(self, tmp_path: Path) -> None:
        """No channel, no timer on disk: no systemctl call at all."""
        world = _installed(tmp_path, DEFAULT_CONFIG)
        world.systemd.calls.clear()
        assert follow_timer.keep(world.node.effectors) is None
        assert world.systemd.calls == []
