"""The way back never strands on one damaged file of the last-good: `recover` puts it back
from an intact copy in the store, or falls back to the newest intact known-good release, and
says which in the log, the known-good record (`status`) and the recorded result."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_fsm.actions.recover import recover
from agent_fsm.errors import ReleaseError
from agent_fsm.node.records import known_good
from agent_fsm.views.doctor.checks import doctor
from agent_fsm.views.status.report import status
from tests.helpers import World


def _with_payload(world: World, version: str, **files: bytes) -> Path:
    release = world.add_release(version)
    (release / "payload").mkdir()
    for name, data in files.items():
        (release / "payload" / name).write_bytes(data)
    world.record_digest(version)
    return release


def _damage_in_place(path: Path) -> None:
    """What a bad disk does: other bytes in the same file, same size, same inode."""
    with path.open("r+b") as f:
        f.write(b"X")


class TestRepair:
    def test_a_damaged_file_is_put_back_from_another_releases_copy(self, world: World) -> None:
        """The last-good's data file, damaged in place at the rollback, is put back byte for
        byte from another release's intact copy; the node rolls back to it, and status, the
        record and the result say it was repaired."""
        _with_payload(world, "1.0.0", **{"data.log": b"shipped\n", "v": b"1\n"})
        world.installed("1.0.0")
        _with_payload(world, "2.0.0", **{"data.log": b"shipped\n", "v": b"2\n"})
        world.node.controller.fire("begin_upgrade", release="2.0.0")
        world.node.controller.fire("candidate_started")
        damaged = world.paths.releases_dir / "1.0.0" / "payload" / "data.log"
        _damage_in_place(damaged)
        done = recover(world.node)
        assert "rolling back to last-good 1.0.0" in done.message
        assert world.node.releases.selected() == world.node.releases.last_good() == "1.0.0"
        assert damaged.read_bytes() == b"shipped\n"
        world.node.releases.verify("1.0.0")  # intact again
        event = known_good.read(world.paths.known_good_file).way_back
        assert event is not None and (event.action, event.release, event.files) == \
            ("repaired", "1.0.0", ("payload/data.log",))
        doc = world.node.store.read()
        assert doc.last_result is not None
        assert doc.last_result["way_back"].startswith("last-good 1.0.0 was damaged and repaired")
        shown = status(world.node).to_json()
        assert shown["way_back"]["action"] == "repaired"


class TestFallBack:
    def _three(self, world: World) -> Path:
        """1.0.0 and 2.0.0 both promoted here (2.0.0 last), 3.0.0 the candidate judged."""
        _with_payload(world, "1.0.0", v=b"1\n")
        world.installed("1.0.0")
        world.clock.advance(10)
        _with_payload(world, "2.0.0", v=b"2\n")
        world.node.controller.fire("activate", release="2.0.0")
        world.node.controller.fire("settle")
        _with_payload(world, "3.0.0", v=b"3\n")
        world.node.controller.fire("begin_upgrade", release="3.0.0")
        world.node.controller.fire("candidate_started")
        return world.paths.releases_dir / "2.0.0" / "payload" / "v"

    def test_beyond_repair_it_falls_back_to_the_newest_intact_known_good(
            self, world: World) -> None:
        """A last-good file with no intact copy anywhere: the way back makes the newest intact
        known-good release (never the candidate) the last-good and selects it, and status and
        the result say it fell back and why."""
        _damage_in_place(self._three(world))
        recover(world.node)
        releases = world.node.releases
        assert releases.selected() == releases.last_good() == "1.0.0"
        event = known_good.read(world.paths.known_good_file).way_back
        assert event is not None and (event.action, event.release, event.to) == \
            ("fell_back", "2.0.0", "1.0.0")
        assert "payload/v changed content" in event.reason
        doc = world.node.store.read()
        assert doc.last_result is not None and "fell back to 1.0.0" in doc.last_result["way_back"]
        assert world.node.paths.last_good_assets.exists()
        shown = status(world.node).to_json()
        assert (shown["way_back"]["action"], shown["way_back"]["to"]) == ("fell_back", "1.0.0")
        said = [f for f in doctor(world.node, check_systemd=False) if f.check == "way back"]
        assert [(f.level, f.detail.split(" (")[0]) for f in said] == \
            [("warn", "last-good 2.0.0 was damaged beyond repair")]

    def test_with_no_intact_known_good_the_rollback_fails_saying_so(self, world: World) -> None:
        """When every known-good release is damaged too, `recover` fails in one line naming
        the damage (the recovery unit tries again), and nothing is selected but the candidate."""
        _damage_in_place(self._three(world))
        _damage_in_place(world.paths.releases_dir / "1.0.0" / "payload" / "v")
        with pytest.raises(ReleaseError, match="no known-good release to fall back to is intact"):
            recover(world.node)
        assert world.node.releases.selected() == "3.0.0"
