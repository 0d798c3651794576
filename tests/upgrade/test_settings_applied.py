"""An upgrade is judged under the config the operator wrote (DESIGN §1): before the signal is
written, the last-good's templates are rendered with the node's current settings, and the
candidate's templates never reach the held units."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_fsm.errors import Refused
from agent_fsm.node.assets import kept as kept_assets
from agent_fsm.node.config import Config, Judgment, WorkloadConfig
from tests.helpers import World, make_world

CANDIDATE_LINE = "# the candidate's own agent unit\n"
INSTALLED = Config(name="agent", judgment=Judgment(deadline_seconds=4, soak_seconds=1,
                                                    max_attempts=2, restart_seconds=1))
RAISED = INSTALLED._replace(
    judgment=Judgment(deadline_seconds=60, soak_seconds=5, max_attempts=4, restart_seconds=3),
    workload=WorkloadConfig(writable_paths=(Path("/srv/agent-data"),)))


@pytest.fixture
def changed(tmp_path: Path) -> World:
    """A node installed under INSTALLED whose operator then wrote RAISED into its config."""
    world = make_world(tmp_path / "root", INSTALLED).installed("1.0.0")
    return make_world(world.root, RAISED, world.systemd, world.publisher, world.clock)


class TestSettingsApplied:
    def test_held_unit_is_the_last_goods_rendered_with_the_new_settings(
            self, changed: World) -> None:
        """After a config change, `begin_upgrade` writes the last-good's agent unit with the
        new start timeout, restart delay and writable paths, reloads systemd before the
        restart, and the candidate's template change never appears, held through its start."""
        before = changed.paths.agent_unit.read_text()
        assert "TimeoutStartSec=15\n" in before
        changed.add_release("2.0.0", agent_unit=CANDIDATE_LINE + before)
        changed.systemd.calls.clear()
        changed.node.controller.fire("begin_upgrade", release="2.0.0")
        unit = changed.paths.agent_unit.read_text()
        assert "TimeoutStartSec=75\n" in unit  # 60 + 5 + 10
        assert "RestartSec=3\n" in unit
        assert "ReadWritePaths=-/srv/agent-data\n" in unit
        assert CANDIDATE_LINE not in unit
        assert changed.assets_on_disk() == changed.rendered("1.0.0")
        verbs = [verb for verb, _ in changed.systemd.calls]
        assert "daemon-reload" in verbs
        assert verbs.index("daemon-reload") < verbs.index("restart")
        held = changed.assets_on_disk()
        changed.node.controller.fire("candidate_started")
        assert changed.assets_on_disk() == held

    def test_a_missing_asset_is_restored_with_the_new_settings(self, changed: World) -> None:
        """The kept copy, from which holding restores a missing asset, is the one rendered with
        the new settings: a unit deleted during judgment comes back with them."""
        changed.add_release("2.0.0")
        changed.node.controller.fire("begin_upgrade", release="2.0.0")
        kept = kept_assets.read(changed.paths.last_good_assets)
        assert kept is not None and kept.version == "1.0.0" and kept.fits(changed.paths)
        changed.paths.agent_unit.unlink()
        changed.node.controller.fire("candidate_started")
        assert "TimeoutStartSec=75\n" in changed.paths.agent_unit.read_text()

    def test_settings_the_last_goods_units_cannot_hold_refuse_the_upgrade(
            self, changed: World) -> None:
        """When the last-good's units cannot be rendered with the current settings, the upgrade
        is refused up front (exit 3), saying so: nothing recorded, no signal, the gate open."""
        changed.add_release("2.0.0")
        (changed.paths.releases_dir / "1.0.0" / "assets" / "agent.service").unlink()
        with pytest.raises(Refused, match="would not be judged under the current config"):
            changed.node.controller.fire("begin_upgrade", release="2.0.0")
        doc = changed.node.store.read()
        assert (doc.state, doc.pending) == ("converged", None)
        assert not changed.paths.signal_file.exists()
        assert changed.node.effectors.gate.is_open()
