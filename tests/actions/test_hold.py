"""Holds: `agent-fsm hold` refuses upgrades until it ends or is lifted, `--force` goes past it,
and nothing on the way back ever looks at it."""

from __future__ import annotations

import json
import os
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent_fsm.actions import holds, operations
from agent_fsm.actions.recover import recover
from agent_fsm.actions.upgrade import begin_upgrade
from agent_fsm.errors import AgentFsmError, Refused
from agent_fsm.node import config as config_mod
from agent_fsm.node.records import hold
from agent_fsm.views.metrics import collect, exposition
from agent_fsm.views.status.report import status
from tests.cli.test_cli import one_line_error, run
from tests.helpers import World, copy_tree, env_with_stub_systemctl, make_world

# For what runs in this process only (parsing, in-process status): a fixed time. A test that
# hands a hold to a real `agent-fsm` process, which reads the real clock, uses `real_now()`.
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC).timestamp()
CONFIG = 'name = "agent"\n[judgment]\ndeadline_seconds = 60\nsoak_seconds = 5\n'


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One node converged on 1.0.0 with 2.0.0 stored, built once (installing fsyncs a lot) and
    copied for each test; its config file is shared, read-only."""
    base = tmp_path_factory.mktemp("ready")
    (base / "config.toml").write_text(CONFIG)
    world = make_world(base / "root", config_mod.load(base / "config.toml")).installed("1.0.0")
    world.add_release("2.0.0")
    return base


@pytest.fixture
def cfg(template: Path) -> Path:
    return template / "config.toml"


@pytest.fixture
def ready(tmp_path: Path, cfg: Path, template: Path) -> World:
    """Converged on 1.0.0 with the gate open and 2.0.0 stored: an upgrade may start."""
    copy_tree(template / "root", tmp_path / "root")
    return make_world(tmp_path / "root", config_mod.load(cfg))


def cli(world: World, cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = env_with_stub_systemctl(world.root.parent)
    return run("--config", str(cfg), "--root", str(world.root), *args, env=env)


def held_file(world: World) -> Path:
    return world.paths.hold_file


def real_now() -> float:
    """The real clock's time, to the second: what a child process will also read."""
    return float(int(time.time()))


def utc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class TestUntil:
    @pytest.mark.parametrize(("text", "ahead"), [
        ("30m", 1800), ("2h", 7200), ("1d", 86400), ("1w", 7 * 86400), ("1h30m", 5400),
        ("45s", 45), (" 2h ", 7200),
    ])
    def test_durations_count_from_now(self, text: str, ahead: int) -> None:
        """`--until 30m`, `2h`, `1d`, `1w`, `1h30m` end the hold that long after now."""
        assert hold.parse_until(text, NOW) == NOW + ahead

    @pytest.mark.parametrize(("text", "when"), [
        ("2026-11-30T18:00:00+01:00", datetime(2026, 11, 30, 17, 0, tzinfo=UTC)),
        ("2026-11-30T18:00:00Z", datetime(2026, 11, 30, 18, 0, tzinfo=UTC)),
        ("2026-11-30T18:00:00", datetime(2026, 11, 30, 18, 0, tzinfo=UTC)),
        ("2026-12-01", datetime(2026, 12, 1, 0, 0, tzinfo=UTC)),
    ])
    def test_iso_times_with_an_offset_or_else_utc(self, text: str, when: datetime) -> None:
        """An ISO 8601 time is taken with its offset, and as UTC when it has none."""
        assert hold.parse_until(text, NOW) == when.timestamp()

    @pytest.mark.parametrize(("text", "says"), [
        ("soon", "is not an ISO 8601 time"), ("2", "is not an ISO 8601 time"),
        ("-1h", "is not an ISO 8601 time"), ("0m", "no time at all"),
        ("2026-11-30T11:00:00Z", "is in the past"), ("5000w", "more than ten years"),
        ("1h 30m", "is not an ISO 8601 time"),
    ])
    def test_bad_values_say_why(self, text: str, says: str) -> None:
        """A value that is no time, no end, in the past or absurdly far is refused, saying so."""
        with pytest.raises(ValueError, match=says) as caught:
            hold.parse_until(text, NOW)
        assert "\n" not in str(caught.value) and repr(text) in str(caught.value)

    def test_bad_until_on_the_command_line_is_a_usage_error(self, ready: World,
                                                             cfg: Path) -> None:
        """`hold --until soon` exits 2 with one line naming the value and the forms, and no
        hold is written."""
        proc = cli(ready, cfg, "hold", "--reason", "x", "--until", "soon")
        assert proc.returncode == 2
        line = one_line_error(proc)
        assert "'soon'" in line and "30m" in line and "UTC" in line
        assert not held_file(ready).exists()


class TestHoldFile:
    def test_hold_then_status_then_unhold(self, ready: World) -> None:
        """A hold shows in `status --json` as {reason, since, until}; `unhold` removes it."""
        ready.clock.t = NOW
        holds.hold(ready.node, "  quarter-end batch ", NOW + 3600)
        assert status(ready.node).to_json()["hold"] == {
            "reason": "quarter-end batch", "since": NOW, "until": NOW + 3600, "expired": False,
            "error": None}
        assert os.stat(held_file(ready)).st_mode & 0o777 == 0o600
        done = holds.unhold(ready.node)
        assert "quarter-end batch" in done.message and status(ready.node).hold is None
        assert "no hold to lift" in holds.unhold(ready.node).message

    def test_a_new_hold_replaces_the_old(self, ready: World) -> None:
        """`hold` while held replaces the hold (and says which it replaced)."""
        holds.hold(ready.node, "first", None)
        done = holds.hold(ready.node, "second", None)
        assert "replaces" in done.message and "'first'" in done.message
        assert status(ready.node).to_json()["hold"]["reason"] == "second"

    def test_a_reason_is_one_line_of_text(self, ready: World) -> None:
        """An empty, multi-line or overlong reason is refused and nothing is written."""
        for reason in ("", "   ", "two\nlines", "x" * 501):
            with pytest.raises(ValueError, match="--reason"):
                holds.hold(ready.node, reason, None)
            assert not held_file(ready).exists()

    def test_a_damaged_hold_file_still_holds_and_is_named(self, ready: World) -> None:
        """A hold file that is not a valid hold refuses upgrades naming the file; `status`
        shows it as damaged; `hold` will not overwrite it; `unhold` removes it."""
        for body in (b"{", b"", b'{"reason": "", "since": 1, "until": null}',
                     b'{"reason": "x", "since": -1, "until": null}', b'{"reason": "x", "since": 1}',
                     b'{"reason": "x\\u001b[2J", "since": 1, "until": null}', b"[]"):
            held_file(ready).write_bytes(body)
            with pytest.raises(Refused, match=f"hold file {held_file(ready)} is damaged"):
                begin_upgrade(ready.node, "2.0.0")
            shown = status(ready.node).to_json()["hold"]
            assert shown["error"] and str(held_file(ready)) in shown["error"], body
            with pytest.raises(AgentFsmError, match="nothing was written"):
                holds.hold(ready.node, "new", None)
            assert held_file(ready).read_bytes() == body
            holds.unhold(ready.node)
            assert not held_file(ready).exists()
        assert begin_upgrade(ready.node, "2.0.0").state == "candidate_running"

    def test_a_symlink_hold_file_is_damaged_not_followed(self, ready: World,
                                                         tmp_path: Path) -> None:
        """A symlink planted at the hold file is reported damaged, never read through."""
        target = tmp_path / "elsewhere.json"
        target.write_text('{"reason": "x", "since": 1, "until": null}')
        held_file(ready).symlink_to(target)
        assert "symlink" in status(ready.node).to_json()["hold"]["error"]


class TestRefusal:
    def test_upgrade_is_refused_naming_the_hold(self, ready: World, cfg: Path) -> None:
        """While held, `upgrade` exits 3 with one line naming the reason, since, until, how to
        lift the hold and how to override it, and nothing starts; `--force` goes past it."""
        now = ready.clock.t = real_now()  # the child process reads the real clock
        holds.hold(ready.node, "quarter-end batch", now + 7200)
        proc = cli(ready, cfg, "upgrade", "--to", "2.0.0")
        assert proc.returncode == 3, proc.stderr
        line = one_line_error(proc)
        for part in ("'quarter-end batch'", f"since {utc(now)}", f"until {utc(now + 7200)}",
                     "`agent-fsm unhold`", "--force"):
            assert part in line, part
        assert ready.node.signal() is None and ready.node.store.read().state == "converged"

        # `upgrade --force` starts it, naming the hold it goes past; the hold stays.
        proc = cli(ready, cfg, "upgrade", "--to", "2.0.0", "--force")
        assert proc.returncode == 0, proc.stderr
        assert "--force: going past the hold" in proc.stdout and "quarter-end" in proc.stdout
        assert ready.node.signal() is not None and held_file(ready).exists()

    def test_an_expired_hold_no_longer_counts(self, ready: World) -> None:
        """Once its `until` has passed the hold refuses nothing; status shows it expired."""
        ready.clock.t = NOW
        holds.hold(ready.node, "for an hour", NOW + 3600)
        with pytest.raises(Refused):
            begin_upgrade(ready.node, "2.0.0")
        ready.clock.t = NOW + 3600
        assert status(ready.node).to_json()["hold"]["expired"] is True
        assert begin_upgrade(ready.node, "2.0.0").state == "candidate_running"

    def test_install_and_activate_are_not_held(self, ready: World) -> None:
        """A hold stops upgrades only: `activate` and `install` (the operator's hand) go on."""
        holds.hold(ready.node, "held", None)
        assert operations.activate(ready.node, "2.0.0").state == "converged"
        assert operations.install(ready.node, "1.0.0").state == "converged"


class TestRollbackIsNeverHeld:
    def test_a_held_and_inhibited_node_rolls_back_a_failed_candidate(self, ready: World) -> None:
        """With a hold, a damaged hold file's worth of doubt and a live inhibitor in place, a
        failed candidate is still judged failed, rolled back and the node converges on the
        last-good with its gate open."""
        begin_upgrade(ready.node, "2.0.0")
        ready.node.controller.fire("candidate_started")
        holds.hold(ready.node, "held mid-upgrade", None)
        inhibit = ready.paths.real(ready.node.config.inhibitor_dir)
        inhibit.mkdir(parents=True)
        (inhibit / "db").write_text(f"reason=migration\npid={os.getpid()}\n")
        (inhibit / "junk").write_bytes(b"\xff")
        ready.node.controller.fire("judge_failed")
        assert recover(ready.node).state == "recovering"
        ready.node.controller.fire("recovered")
        st = status(ready.node)
        assert (st.state, st.selected, st.gate) == ("converged", "1.0.0", "open")
        assert st.last_result is not None and st.last_result["outcome"] == "rolled_back"
        assert st.hold is not None and len(st.inhibitors) == 2  # still there, never in the way

    def test_an_orphaned_signal_rolls_back_while_held(self, ready: World) -> None:
        """A signal the state file lost is rolled back by `recover` though a damaged hold file
        and an unreadable inhibitor directory are in place."""
        begin_upgrade(ready.node, "2.0.0")
        doc = ready.node.store.read()
        held_file(ready).write_text("{")
        inhibit = ready.paths.real(ready.node.config.inhibitor_dir)
        inhibit.parent.mkdir(parents=True, exist_ok=True)
        inhibit.write_text("not a directory")
        doc.state, doc.upgrade = "converged", None
        with ready.node.store.locked():
            ready.node.store.write(doc)
        assert recover(ready.node).state == "recovering"
        ready.node.controller.fire("recovered")
        assert ready.node.releases.selected() == "1.0.0"


class TestShown:
    def test_hold_status_and_unhold_on_the_command_line(self, ready: World, cfg: Path) -> None:
        """`hold --json` prints the hold as `status --json` does; human `status` shows its
        reason and `agent-fsm unhold`; `unhold --json` shows none left."""
        data = json.loads(cli(ready, cfg, "hold", "--reason", "quarter-end batch", "--until",
                              "2h", "--json").stdout)
        assert data["hold"]["reason"] == "quarter-end batch"
        assert data["hold"]["until"] - data["hold"]["since"] == pytest.approx(7200, abs=5)
        human = cli(ready, cfg, "status")
        assert "quarter-end batch" in human.stdout and "agent-fsm unhold" in human.stdout
        assert json.loads(cli(ready, cfg, "unhold", "--json").stdout)["hold"] is None
        assert status(ready.node).hold is None

    def test_metrics_count_the_hold(self, ready: World) -> None:
        """`agent_fsm_hold_active` is 1 while a hold counts, 0 once it expired or was lifted."""
        def active() -> str:
            return next(line for line in exposition(collect(ready.node)).splitlines()
                        if line.startswith("agent_fsm_hold_active{"))

        assert active().endswith(" 0")
        ready.clock.t = NOW
        holds.hold(ready.node, "x", NOW + 60)
        assert active().endswith(" 1")
        ready.clock.t = NOW + 61
        assert active().endswith(" 0")
