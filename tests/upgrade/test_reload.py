"""A start and the way back reload systemd only when a unit file changed; every transition
that writes all the assets reloads it always. No reload is made for its side effects."""

from __future__ import annotations

from tests.helpers import World

BOTH = ("show", "agent.service agent-recovery.service")
RELOAD = ("daemon-reload", "")


def _rolled_back(world: World) -> World:
    world.installed("1.0.0").upgrading("2.0.0")
    world.node.controller.fire("recover")
    return world


def _recovered(world: World) -> list[tuple[str, str]]:
    before = len(world.systemd.calls)
    world.node.controller.fire("recovered")
    return world.systemd.calls[before:]


class TestRecovered:
    def test_held_units_systemd_has_as_they_are_are_not_reloaded(self, world: World) -> None:
        """The last-good's held files are on disk as systemd loaded them: `recovered` asks
        systemd (one `systemctl show`) and does not reload."""
        _rolled_back(world).systemd.loaded_fresh = True
        assert _recovered(world) == [BOTH]
        assert world.node.store.read().state == "converged" and world.node.gate.is_open()

    def test_a_unit_systemd_says_changed_is_reloaded(self, world: World) -> None:
        """When systemd says a unit file is not what it loaded, `recovered` reloads it."""
        _rolled_back(world).systemd.loaded_fresh = False
        assert _recovered(world) == [BOTH, RELOAD]

    def test_when_systemd_cannot_be_asked_it_reloads(self, world: World) -> None:
        """A failing `systemctl show` is no reason to skip the reload: it reloads."""
        _rolled_back(world).systemd.loaded_fresh = True
        world.systemd.fail = {"show"}
        assert _recovered(world) == [RELOAD]

    def test_a_held_file_that_drifted_is_written_back(self, world: World) -> None:
        """A held asset edited during the upgrade is written back as the last-good renders
        it, like any other that differs."""
        _rolled_back(world)
        world.paths.recovery_script.write_text("#!/bin/sh\nexit 0\n")
        _recovered(world)
        assert world.assets_on_disk() == world.rendered("1.0.0")


class TestSettle:
    def test_a_start_with_nothing_changed_does_not_reload(self, world: World) -> None:
        """A converged start (`settle`) whose unit files systemd has as they are on disk does
        not reload systemd: nothing depends on a reload's side effect."""
        world.installed("1.0.0")
        world.systemd.loaded_fresh = True
        before = len(world.systemd.calls)
        world.node.controller.fire("settle")
        assert RELOAD not in world.systemd.calls[before:]
        assert world.node.gate.is_open()

    def test_a_start_that_rewrote_a_unit_reloads(self, world: World) -> None:
        """A converged start that rewrote a unit file reloads systemd before opening the gate."""
        world.installed("1.0.0")
        world.paths.agent_unit.write_text("[Service]\nExecStart=/bin/true\n")
        world.systemd.loaded_fresh = False
        before = len(world.systemd.calls)
        world.node.controller.fire("settle")
        assert world.systemd.calls[before:] == [BOTH, RELOAD]
        assert world.assets_on_disk() == world.rendered("1.0.0")
