"""The way back depends only on the last-good and the host (DESIGN §1, §5):
the last-good's rendered assets are kept in the state dir when it is promoted, and holding
restores a missing asset from there, never from the candidate's release or templates."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable

import pytest

from agent_fsm.agent.publishing import open_gate_after_judgment
from agent_fsm.errors import AssetError
from agent_fsm.node.assets import kept as kept_assets
from agent_fsm.node.assets.render import Asset
from tests.helpers import World

BROKEN_SCRIPT = "#!/bin/sh\n# the candidate's broken recovery\nexit 1\n"
SCRIPT = "agent-recovery.sh"


def _kept(world: World) -> kept_assets.KeptAssets:
    kept = kept_assets.read(world.paths.last_good_assets)
    assert kept is not None, "no kept copy of the last-good's assets"
    return kept


def _as_tuples(assets: tuple[Asset, ...]) -> list[tuple[object, ...]]:
    return [(a.host_path, a.path, a.mode, a.content) for a in assets]


def _begin_then(world: World, to: str, damage: Callable[[], object], **templates: str) -> None:
    """Begin an upgrade, then `damage` the node (begin_upgrade itself writes the last-good's
    assets and its kept copy), then start the candidate."""
    world.add_release(to, **templates)
    world.node.controller.fire("begin_upgrade", release=to)
    damage()
    world.node.controller.fire("candidate_started")


def _begin(world: World, to: str) -> None:
    """Start an upgrade to an already stored release, as `upgrading` does for a new one."""
    world.node.controller.fire("begin_upgrade", release=to)
    world.node.controller.fire("candidate_started")


class TestLastGoodAssets:
    def test_deleted_script_is_restored_from_the_kept_copy_not_the_candidate(
            self, world: World) -> None:
        """A recovery script deleted before an upgrade to a candidate with a broken script comes
        back byte for byte, mode 0755, as the last-good's kept copy, not the candidate's."""
        world.installed("1.0.0")
        kept_script = _kept(world).contents["recovery.sh"]
        world.paths.recovery_script.unlink()
        held_units = {k: v for k, v in world.assets_on_disk().items() if k != SCRIPT}
        world.upgrading("2.0.0", recovery_script=BROKEN_SCRIPT)
        restored = world.paths.recovery_script.read_bytes()
        assert (world.paths.recovery_script.stat().st_mode & 0o7777, restored) == kept_script
        assert kept_script[0] == 0o755
        assert restored == world.rendered("1.0.0")[SCRIPT]
        assert restored != world.rendered("2.0.0")[SCRIPT]
        assert {k: v for k, v in world.assets_on_disk().items() if k != SCRIPT} == held_units

    def test_candidate_without_a_template_does_not_strand_the_node(self, world: World) -> None:
        """A candidate lacking a template entirely: `candidate_started` completes with nothing
        owed, the last-good's assets are held (the missing one restored) and judgment proceeds."""
        world.installed("1.0.0")
        before = world.assets_on_disk()
        world.paths.recovery_unit.unlink()
        (world.add_release("2.0.0") / "assets" / "recovery.service").unlink()
        world.record_digest("2.0.0")
        _begin(world, "2.0.0")
        doc = world.node.store.read()
        assert (doc.state, doc.pending) == ("candidate_running", None)
        assert world.assets_on_disk() == before
        assert world.node.controller.fire("judge_ok").state == "judged_ok"

    def test_copy_is_kept_at_every_promotion_and_matches_the_render(self, world: World) -> None:
        """install, activate and a completed upgrade each keep exactly what the promoted release
        renders for this host (mode 0600); a pending upgrade keeps the last-good's copy."""
        world.installed("1.0.0")
        assert (_kept(world).version, world.paths.last_good_assets.stat().st_mode & 0o777) \
            == ("1.0.0", 0o600)
        assert _as_tuples(_kept(world).assets(world.paths)) \
            == _as_tuples(world.node.effectors.rendered("1.0.0"))
        world.upgrading("2.0.0")
        assert _kept(world).version == "1.0.0"
        world.node.controller.fire("judge_ok")
        assert open_gate_after_judgment(world.node.controller, world.clock).state == "converged"
        assert _kept(world).version == "2.0.0"
        assert _as_tuples(_kept(world).assets(world.paths)) \
            == _as_tuples(world.node.effectors.rendered("2.0.0"))
        world.add_release("3.0.0")
        world.node.controller.fire("activate", release="3.0.0")
        assert _as_tuples(_kept(world).assets(world.paths)) \
            == _as_tuples(world.node.effectors.rendered("3.0.0"))

    def test_without_a_kept_copy_the_last_goods_release_is_rendered(
            self, world: World, caplog: pytest.LogCaptureFixture) -> None:
        """A node promoted before copies were kept restores a missing asset from the last-good's
        release, never the candidate's, and logs which it used."""
        world.installed("1.0.0")

        def damage() -> None:
            world.paths.last_good_assets.unlink()
            world.paths.recovery_script.unlink()
        with caplog.at_level(logging.INFO, logger="agent_fsm"):
            _begin_then(world, "2.0.0", damage, recovery_script=BROKEN_SCRIPT)
        assert world.paths.recovery_script.read_bytes() == world.rendered("1.0.0")[SCRIPT]
        assert world.paths.recovery_script.stat().st_mode & 0o7777 == 0o755
        assert any(r.levelno == logging.WARNING
                   and "rendered from last-good 1.0.0's release" in r.getMessage()
                   and "no copy of its assets is kept" in r.getMessage() for r in caplog.records)

    def test_kept_copy_suffices_without_the_last_goods_release(self, world: World) -> None:
        """With the last-good's release directory gone from the store, a missing asset is still
        restored, from the kept copy."""
        world.installed("1.0.0")
        want = world.rendered("1.0.0")[SCRIPT]

        def damage() -> None:
            shutil.rmtree(world.node.releases.path("1.0.0"))
            world.paths.recovery_script.unlink()
        _begin_then(world, "2.0.0", damage, recovery_script=BROKEN_SCRIPT)
        assert world.paths.recovery_script.read_bytes() == want
        assert world.node.store.read().pending is None

    def test_damaged_copy_is_left_untouched_and_the_release_is_rendered(
            self, world: World, caplog: pytest.LogCaptureFixture) -> None:
        """A kept copy that fails its checksum is not trusted: it is left as it is, logged, and
        the missing asset is rendered from the last-good's release."""
        world.installed("1.0.0")
        damaged = b""

        def damage() -> None:
            nonlocal damaged
            damaged = world.paths.last_good_assets.read_bytes().replace(b'"1.0.0"', b'"9.9.9"')
            world.paths.last_good_assets.write_bytes(damaged)
            world.paths.recovery_script.unlink()
        with caplog.at_level(logging.WARNING, logger="agent_fsm"):
            _begin_then(world, "2.0.0", damage, recovery_script=BROKEN_SCRIPT)
        assert world.paths.recovery_script.read_bytes() == world.rendered("1.0.0")[SCRIPT]
        assert world.paths.last_good_assets.read_bytes() == damaged
        assert any("checksum" in r.getMessage() and "left untouched" in r.getMessage()
                   for r in caplog.records)

    def test_neither_copy_nor_release_fails_clearly_and_writes_nothing(self, world: World) -> None:
        """With no kept copy and no last-good release, holding refuses with an error naming the
        last-good and what to do, and writes nothing from the candidate."""
        world.installed("1.0.0")
        world.add_release("2.0.0")
        world.node.controller.fire("begin_upgrade", release="2.0.0")
        world.paths.last_good_assets.unlink()
        shutil.rmtree(world.node.releases.path("1.0.0"))
        world.paths.recovery_script.unlink()
        with pytest.raises(AssetError, match=r"last-good 1\.0\.0's missing.*release add"):
            world.node.controller.fire("candidate_started")
        assert not world.paths.recovery_script.exists()

    def test_unrenderable_promotion_leaves_no_stale_copy_and_opens_the_gate(
            self, world: World) -> None:
        """A completed upgrade whose release cannot render its assets keeps no copy (never the
        previous last-good's under the new name) and still opens the gate."""
        world.installed("1.0.0")
        world.upgrading("2.0.0", agent_unit="[Service]\nExecStart=${no_such_placeholder}\n")
        world.node.controller.fire("judge_ok")
        doc = open_gate_after_judgment(world.node.controller, world.clock)
        assert doc.state == "converged" and world.node.gate.is_open()
        assert world.node.releases.last_good() == "2.0.0"
        assert not world.paths.last_good_assets.exists()
