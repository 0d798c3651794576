"""The operator's commands on real files: recover, install --no-start, release list."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_fsm.actions.operations import begin_upgrade, install, recover
from agent_fsm.errors import ReleaseError
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
        it and the selection both; a change made afterwards is still refused at its next use."""
        checks: list[str] = []
        real = release_store.check

        def counted(releases_dir: Path, version: str, hashed: object = None) -> object:
            checks.append(version)
            return real(releases_dir, version, hashed)  # type: ignore[arg-type]

        world.installed("1.0.0")
        world.add_release("2.0.0")
        monkeypatch.setattr(release_store, "check", counted)
        begin_upgrade(world.node, "2.0.0")
        assert checks == ["2.0.0"]
        (world.paths.releases_dir / "2.0.0" / "assets" / "agent.service").write_text("# changed\n")
        with pytest.raises(ReleaseError, match="is not what was stored"):
            world.node.releases.manifest("2.0.0")
