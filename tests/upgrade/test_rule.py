"""The rule (DESIGN §1): while an upgrade is pending, the last-good's assets are the only way back."""

from __future__ import annotations

import logging
import os

import pytest

from agent_fsm.agent.publishing import open_gate_after_judgment
from agent_fsm.errors import PublishError
from agent_fsm.system.publish import Result
from tests.helpers import World

BROKEN_UNIT = "[Service]\nExecStart=/nonexistent/${name} broken by ${version}\n"


class TestHoldWhileSignalled:
    def test_existing_assets_stay_byte_for_byte(self, world: World) -> None:
        """With a signal, the candidate's start keeps the last-good's units and script as they are."""
        world.installed("1.0.0")
        before = world.assets_on_disk()
        world.upgrading("2.0.0", agent_unit=BROKEN_UNIT, recovery_script="#!/bin/sh\nexit 1\n")
        assert world.node.effectors.signal() is not None
        assert world.assets_on_disk() == before
        assert before != world.rendered("2.0.0")

    def test_missing_asset_is_still_written(self, world: World) -> None:
        """With a signal, an asset missing from disk is written: the last-good's, never the
        candidate's (tests/upgrade/test_last_good_assets.py has the details)."""
        world.installed("1.0.0")
        world.paths.recovery_script.unlink()
        kept_unit = world.paths.agent_unit.read_bytes()
        world.upgrading("2.0.0")
        assert world.paths.recovery_script.read_bytes() == world.rendered("1.0.0")["agent-recovery.sh"]
        assert world.paths.agent_unit.read_bytes() == kept_unit

    def test_without_signal_all_differing_assets_are_rewritten(self, world: World) -> None:
        """Without a signal, startup rewrites every asset that differs from the selected release."""
        world.installed("1.0.0")
        for p in (world.paths.agent_unit, world.paths.recovery_unit, world.paths.recovery_script):
            p.write_text("# edited by hand\n")
        world.node.controller.fire("settle")
        assert world.assets_on_disk() == world.rendered("1.0.0")

    def test_modes_are_exact_under_any_umask(self, world: World) -> None:
        """Units are written 0644 and the script 0755 even under umask 077 or 000."""
        for umask in (0o077, 0o000):
            old = os.umask(umask)
            try:
                world.paths.agent_unit.unlink(missing_ok=True)
                world.paths.recovery_script.unlink(missing_ok=True)
                world.installed("1.0.0")
            finally:
                os.umask(old)
            assert world.paths.agent_unit.stat().st_mode & 0o7777 == 0o644
            assert world.paths.recovery_script.stat().st_mode & 0o7777 == 0o755


class TestAfterJudgment:
    def test_publish_then_clear_then_write_and_reload_then_gate(self, world: World) -> None:
        """Judged ok: the result is published, then the signal cleared, then the assets written and
        systemd reloaded, and only then the gate opens."""
        world.installed("1.0.0")
        world.upgrading("2.0.0")
        seen: list[tuple[str, bool, bool, bool]] = []
        new = world.rendered("2.0.0")

        def look(event: str) -> None:
            seen.append((event, world.node.effectors.signal() is not None,
                         world.assets_on_disk() == new, world.node.effectors.gate.is_open()))

        world.publisher.on_publish = lambda _r: look("publish")
        world.systemd.on_call = lambda verb, _u: look(verb)
        world.node.controller.fire("judge_ok")
        doc = open_gate_after_judgment(world.node.controller, world.clock)

        assert seen == [
            # event, signal present, candidate's assets on disk, gate open
            ("publish", True, False, False),
            ("daemon-reload", False, True, False),
        ]
        assert doc.state == "converged"
        assert world.node.effectors.gate.is_open()
        assert world.node.effectors.releases.last_good() == "2.0.0"
        assert world.publisher.published[0].outcome == "ok"

    def test_recovery_keeps_signal_assets_and_gate(self, world: World) -> None:
        """Judged failed and recovering: the signal stays, nothing is written, the gate stays shut."""
        world.installed("1.0.0")
        before = world.assets_on_disk()
        world.upgrading("2.0.0", agent_unit=BROKEN_UNIT)
        world.node.controller.fire("judge_failed")
        world.node.controller.fire("recover")
        # The last-good's daemon restarts while the signal still exists: it too holds.
        world.reopen().node.controller.resume()
        assert world.node.effectors.signal() is not None
        assert world.assets_on_disk() == before
        assert not world.node.effectors.gate.is_open()
        assert world.node.effectors.releases.selected() == "1.0.0"
        assert ("start", "agent-recovery.service") in world.systemd.calls
        # Recorded for delivery; the way back never waits on the publish command.
        assert [r.outcome for r in world.publisher.recorded] == ["rolled_back"]
        assert world.publisher.attempts == 0

    def test_recovered_clears_signal_writes_last_good_assets_and_opens_gate(
            self, world: World) -> None:
        """When the last-good's daemon is back, it clears the signal, writes its assets, opens."""
        world.installed("1.0.0")
        world.upgrading("2.0.0", agent_unit=BROKEN_UNIT)
        world.node.controller.fire("recover")
        world.paths.recovery_unit.unlink()  # damage to repair on the way out
        world.node.controller.fire("recovered")
        assert world.node.effectors.signal() is None
        assert world.assets_on_disk() == world.rendered("1.0.0")
        assert world.node.effectors.gate.is_open()

    def test_failed_publish_is_retried_and_gate_waits(self, world: World) -> None:
        """A failed publish is retried; the gate does not open until a publish has succeeded."""
        world.installed("1.0.0")
        world.upgrading("2.0.0")
        world.node.controller.fire("judge_ok")
        world.publisher.failures = 2
        gate_at_publish: list[bool] = []

        def look(_r: Result) -> None:
            gate_at_publish.append(world.node.effectors.gate.is_open())

        world.publisher.on_publish = look
        doc = open_gate_after_judgment(world.node.controller, world.clock)
        assert world.publisher.attempts == 3
        assert gate_at_publish == [False, False, False]
        assert world.clock.sleeps == [1.0, 2.0]
        assert doc.state == "converged" and world.node.effectors.gate.is_open()
        assert world.node.effectors.signal() is None

    def test_publish_failing_for_good_leaves_gate_closed(self, world: World) -> None:
        """If publishing never works, the gate stays closed and the work stays owed."""
        world.installed("1.0.0")
        world.upgrading("2.0.0")
        world.node.controller.fire("judge_ok")
        world.publisher.failures = 100
        with pytest.raises(PublishError, match="injected failure"):
            open_gate_after_judgment(world.node.controller, world.clock, max_tries=4)
        assert not world.node.effectors.gate.is_open()
        assert world.node.effectors.signal() is not None
        assert world.node.store.read().pending is not None

    def test_gate_opens_when_writing_assets_fails(self, world: World,
                                                  caplog: pytest.LogCaptureFixture) -> None:
        """Writing the assets after success may fail: it is logged, the last-good's stay, the gate opens."""
        world.installed("1.0.0")
        before = world.assets_on_disk()
        world.upgrading("2.0.0", agent_unit="[Service]\nExecStart=${no_such_placeholder}\n")
        world.node.controller.fire("judge_ok")
        with caplog.at_level(logging.ERROR, logger="agent_fsm"):
            doc = open_gate_after_judgment(world.node.controller, world.clock)
        assert doc.state == "converged"
        assert world.node.effectors.gate.is_open()
        assert world.assets_on_disk() == before
        assert any("write_assets failed" in r.getMessage() and "no_such_placeholder" in r.getMessage()
                   for r in caplog.records)


class TestWritesEverything:
    def test_install_writes_all_assets(self, world: World) -> None:
        """install writes all three assets, reloads, enables and starts the agent."""
        world.add_release("1.0.0")
        for p in (world.paths.agent_unit, world.paths.recovery_script):
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text("# stale\n")
        world.node.controller.fire("install", release="1.0.0")
        assert world.assets_on_disk() == world.rendered("1.0.0")
        assert world.systemd.calls == [("daemon-reload", ""), ("enable", "agent.service"),
                                       ("restart", "agent.service")]
        assert world.node.effectors.signal() is None

    def test_activate_writes_all_assets_without_signal(self, world: World) -> None:
        """Direct activation creates no signal and writes all assets of the activated release."""
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world.node.controller.fire("activate", release="2.0.0")
        assert world.node.effectors.signal() is None
        assert world.assets_on_disk() == world.rendered("2.0.0")
        assert world.node.effectors.releases.selected() == "2.0.0"
        assert world.node.effectors.releases.last_good() == "2.0.0"
