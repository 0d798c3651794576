"""Back on the last-good, systemd is reloaded only when a unit file changed; every other
transition that writes the assets reloads it always (its reload also resets the start limit)."""

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


def test_a_start_always_reloads(world: World) -> None:
    """A converged start (`settle`) reloads systemd without asking, even with nothing written:
    that reload is also what keeps a converged agent's restarts off the start limit."""
    world.installed("1.0.0")
    world.systemd.loaded_fresh = True
    before = len(world.systemd.calls)
    world.node.controller.fire("settle")
    assert world.systemd.calls[before:] == [RELOAD]
