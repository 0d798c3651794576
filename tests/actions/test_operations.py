"""The operator's commands on real files: recover, install --no-start, upgrade (and the
recovery unit it waits for), release list."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest

from agent_fsm.actions.operations import install
from agent_fsm.actions.recover import recover
from agent_fsm.actions.upgrade import Waiting, begin_upgrade, upgrade, wait_for_recovery
from agent_fsm.errors import Refused, ReleaseError
from agent_fsm.node.releases import store as release_store
from tests.helpers import World


class TestRecover:
    def test_recover_twice_is_safe(self, world: World) -> None:
        """recover rolls a pending upgrade back; running it again changes nothing more."""
        world.installed("1.0.0").upgrading("2.0.0")
        first = recover(world.node)
        assert first.state == "recovering" and "rolling back to last-good 1.0.0" in first.message
        calls = list(world.systemd.calls)
        second = recover(world.node)
        assert second.state == "recovering"
        assert world.node.effectors.releases.selected() == "1.0.0"
        assert world.node.effectors.signal() is not None  # kept until the last-good is back
        assert world.systemd.calls[len(calls):] == [("reset-failed", "agent.service"),
                                                    ("restart", "agent.service")]

    def test_recover_with_nothing_pending_says_so(self, world: World) -> None:
        """With no upgrade pending, recover says so and touches nothing."""
        world.installed("1.0.0")
        before = world.paths.state_file.read_bytes()
        done = recover(world.node)
        assert done.message == "nothing to roll back: no upgrade is pending"
        assert world.paths.state_file.read_bytes() == before


class TestInstall:
    def test_no_start_writes_and_reloads_only(self, world: World) -> None:
        """install --no-start writes all assets and reloads, but neither enables nor starts."""
        world.add_release("1.0.0")
        done = install(world.node, "1.0.0", start=False)
        assert "not started" in done.message
        assert world.assets_on_disk() == world.rendered("1.0.0")
        assert world.systemd.calls == [("daemon-reload", "")]


class TestBeginUpgrade:
    def test_the_candidate_is_checked_once_and_again_at_its_next_use(
            self, world: World, monkeypatch: pytest.MonkeyPatch) -> None:
        """`upgrade` checks the candidate against its digest once, for the condition that finds
        it and the selection both (and the last-good once, whose templates it renders with the
        current settings); a change made afterwards is still refused at its next use."""
        checks: list[str] = []
        real = release_store.check

        def counted(releases_dir: Path, version: str, hashed: object = None) -> object:
            checks.append(version)
            return real(releases_dir, version, hashed)  # type: ignore[arg-type]

        world.installed("1.0.0")
        world.add_release("2.0.0")
        monkeypatch.setattr(release_store, "check", counted)
        begin_upgrade(world.node, "2.0.0")
        assert sorted(checks) == ["1.0.0", "2.0.0"]
        (world.paths.releases_dir / "2.0.0" / "assets" / "agent.service").write_text("# changed\n")
        with pytest.raises(ReleaseError, match="is not what was stored"):
            world.node.releases.manifest("2.0.0")


class TestRecoveryAtWork:
    """A recovery unit still at work was started for the upgrade before: a new upgrade waits
    for it and is refused while it lasts, or its next try would roll the new one back."""

    RETRYING: ClassVar[dict[str, str]] = {"ActiveState": "activating", "SubState": "auto-restart"}

    def test_an_upgrade_is_refused_while_the_recovery_unit_tries_again(
            self, world: World) -> None:
        """With the recovery unit waiting to try again, `begin_upgrade` is refused (exit 3),
        naming the unit and what to wait for, and nothing is changed: no signal, the last-good
        selected, the gate open, nothing asked of systemd but the question."""
        world.installed("1.0.0").add_release("2.0.0")
        world.systemd.shown_for["agent-recovery.service"] = dict(self.RETRYING)
        before = world.paths.state_file.read_bytes()
        asked = len(world.systemd.calls)
        with pytest.raises(Refused) as refused:
            begin_upgrade(world.node, "2.0.0", force=True)  # no --force goes past it
        assert refused.value.exit_code == 3
        assert str(refused.value).startswith(
            "agent-recovery.service is still at work (activating (auto-restart)): it was "
            "started for the last upgrade")
        assert "systemctl is-active agent-recovery.service" in str(refused.value)
        assert world.paths.state_file.read_bytes() == before
        assert world.node.effectors.signal() is None
        assert world.node.effectors.releases.selected() == "1.0.0"
        assert world.node.gate.is_open()
        assert world.systemd.calls[asked:] == [("show", "agent-recovery.service")]

    @pytest.mark.parametrize("shown", [
        {"ActiveState": "inactive", "SubState": "dead"},
        {"ActiveState": "failed", "SubState": "failed"},  # stopped by hand mid-try: no next try
        {"ActiveState": "active", "SubState": "exited"},  # done, kept by RemainAfterExit=yes
        {},  # a unit systemd does not know (a stub systemctl)
    ], ids=["inactive", "failed", "done", "unknown"])
    def test_an_upgrade_goes_on_when_the_recovery_unit_rests(
            self, world: World, shown: dict[str, str]) -> None:
        """An inactive, failed, done or unknown recovery unit does not hold an upgrade back."""
        world.installed("1.0.0").add_release("2.0.0")
        world.systemd.shown_for["agent-recovery.service"] = shown
        assert begin_upgrade(world.node, "2.0.0").state == "candidate_running"

    def test_the_failed_before_auto_restart_state_is_at_work(self, world: World) -> None:
        """On systemd 255+ a failed try passes through `failed` on its way to the restart: the
        sub-state says it is at work."""
        world.installed("1.0.0").add_release("2.0.0")
        world.systemd.shown_for["agent-recovery.service"] = {
            "ActiveState": "failed", "SubState": "failed-before-auto-restart"}
        with pytest.raises(Refused, match=r"still at work \(failed \(failed-before-auto-restart"):
            begin_upgrade(world.node, "2.0.0")

    def test_systemd_that_cannot_say_does_not_hold_an_upgrade_back(self, world: World) -> None:
        """When `systemctl show` fails, nothing is known to be at work: the upgrade goes on."""
        world.installed("1.0.0").add_release("2.0.0")
        world.systemd.fail.add("show")
        assert begin_upgrade(world.node, "2.0.0").state == "candidate_running"

    def test_the_wait_ends_when_the_recovery_unit_finishes(self, world: World) -> None:
        """`wait_for_recovery` waits while the recovery unit is at work, says so once, and
        returns once it has finished: the upgrade then goes through."""
        world.installed("1.0.0").add_release("2.0.0")
        unit = world.systemd.shown_for["agent-recovery.service"] = dict(self.RETRYING)
        asked: list[str] = []

        def finishes_at_the_third_question(verb: str, name: str) -> None:
            asked.append(name)
            if len(asked) == 3:
                unit.update(ActiveState="inactive", SubState="dead")

        world.systemd.on_call = finishes_at_the_third_question
        told: list[str] = []
        waited = wait_for_recovery(world.node, timeout=10, on_wait=told.append, poll=0.01)
        assert told == ["activating (auto-restart)"]
        assert 0 < waited < 10 and len(asked) == 3
        assert begin_upgrade(world.node, "2.0.0").state == "candidate_running"

    def test_upgrade_begun_while_the_recovery_unit_is_at_work_waits_then_begins(
            self, world: World) -> None:
        """`upgrade` refused because the recovery unit is at work says it waits, waits until the
        unit is done, then begins."""
        world.installed("1.0.0").add_release("2.0.0")
        unit = world.systemd.shown_for["agent-recovery.service"] = dict(self.RETRYING)
        shows: list[str] = []

        def done_at_the_fourth_question(verb: str, name: str) -> None:
            if (verb, name) == ("show", "agent-recovery.service"):
                shows.append(name)
                if len(shows) == 4:
                    unit.update(ActiveState="inactive", SubState="dead")

        world.systemd.on_call = done_at_the_fourth_question
        told: list[object] = []
        done = upgrade(world.node, "2.0.0", tell=told.append)
        assert isinstance(told[0], Waiting) and told[0].state == "activating (auto-restart)"
        assert (done.from_version, done.to_version) == ("1.0.0", "2.0.0")
        assert world.node.store.read().state == "candidate_running" and len(shows) >= 4

    def test_upgrade_asks_about_a_resting_recovery_unit_once(self, world: World) -> None:
        """With the recovery unit at rest, `upgrade` asks systemd about it once (the condition
        under the lock), and waits for nothing."""
        world.installed("1.0.0").add_release("2.0.0")
        world.systemd.shown_for["agent-recovery.service"] = {"ActiveState": "inactive"}
        asked, told = len(world.systemd.calls), []
        upgrade(world.node, "2.0.0", tell=told.append)
        assert world.systemd.calls[asked:].count(("show", "agent-recovery.service")) == 1
        assert not any(isinstance(t, Waiting) for t in told)

    def test_the_wait_is_bounded(self, world: World) -> None:
        """A recovery unit that stays at work is waited for at most the timeout; the upgrade
        after it is refused."""
        world.installed("1.0.0").add_release("2.0.0")
        world.systemd.shown_for["agent-recovery.service"] = dict(self.RETRYING)
        waited = wait_for_recovery(world.node, timeout=0.05, poll=0.01)
        assert 0.05 <= waited < 5
        with pytest.raises(Refused, match="still at work"):
            begin_upgrade(world.node, "2.0.0")

    def test_nothing_is_waited_for_when_it_rests(self, world: World) -> None:
        """With the recovery unit inactive, `wait_for_recovery` returns at once, saying
        nothing."""
        world.installed("1.0.0")
        world.systemd.shown_for["agent-recovery.service"] = {"ActiveState": "inactive"}
        told: list[str] = []
        assert wait_for_recovery(world.node, on_wait=told.append) == 0.0
        assert told == []
