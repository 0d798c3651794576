"""Releases: pack one that runs on its own, add it, list, prune; rendered units verify cleanly."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from agent_fsm.actions.releases.packing import add, pack
from agent_fsm.actions.releases.pruning import prune
from agent_fsm.errors import AssetError, ReleaseError
from agent_fsm.node.config import Config
from agent_fsm.testing import FakeClock, FakePublisher, FakeSystemd
from agent_fsm.wiring import open_node
from tests.helpers import World


@pytest.fixture
def packed(tmp_path: Path) -> Path:
    return pack("2.0.0", tmp_path / "rel-2.0.0", ("sleep", "infinity"))


class TestPack:
    def test_packed_release_runs_on_its_own(self, packed: Path, tmp_path: Path) -> None:
        """A packed release's bin/agent-fsm runs its own copy of agent-fsm, from any directory."""
        proc = subprocess.run([str(packed / "bin" / "agent-fsm"), "--version"], cwd=tmp_path,
                              capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("agent-fsm ")
        (packed / "lib" / "agent_fsm" / "__init__.py").write_text('__version__ = "patched"\n')
        proc = subprocess.run([str(packed / "bin" / "agent-fsm"), "--version"], cwd=tmp_path,
                              capture_output=True, text=True, check=False)
        assert proc.stdout.strip() == "agent-fsm patched (release 2.0.0)"

    def test_runs_through_a_chain_of_links(self, packed: Path, tmp_path: Path) -> None:
        """bin/agent-fsm reached through links (as `bin_link` → `selected` → the release does)
        still finds its own lib/ and says which release it is."""
        (tmp_path / "selected").symlink_to(packed)
        (tmp_path / "via-selected").symlink_to(tmp_path / "selected" / "bin" / "agent-fsm")
        (tmp_path / "bin").mkdir()
        (tmp_path / "bin" / "agent-fsm").symlink_to("../via-selected")
        proc = subprocess.run([str(tmp_path / "bin" / "agent-fsm"), "--version"], cwd="/",
                              capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip().endswith("(release 2.0.0)")

    def test_usage_names_agent_fsm(self, packed: Path, tmp_path: Path) -> None:
        """A release's usage lines say `agent-fsm`, not how its launcher runs Python."""
        proc = subprocess.run([str(packed / "bin" / "agent-fsm"), "install", "--help"],
                              cwd=tmp_path, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("Usage: agent-fsm install ")
        assert "python -m" not in proc.stdout

    def test_manifest_names_version_and_workload(self, packed: Path) -> None:
        """release.toml carries the version and the workload command."""
        text = (packed / "release.toml").read_text()
        assert 'version = "2.0.0"' in text and 'workload = ["sleep", "infinity"]' in text

    def test_pack_refuses_existing_output(self, packed: Path) -> None:
        """Packing over an existing directory is refused; nothing there changes."""
        with pytest.raises(ReleaseError, match="already exists"):
            pack("2.0.0", packed)


class TestAddListPrune:
    def test_add_stores_and_validates(self, world: World, packed: Path) -> None:
        """add stores a valid release under releases/<version>; adding again is a no-op."""
        first = add(packed, world.node)
        assert not first.already and (first.path / "bin" / "agent-fsm").exists()
        assert world.node.effectors.releases.versions() == ["2.0.0"]
        assert add(packed, world.node).already

    def test_add_refuses_version_mismatch_and_bad_templates(self, world: World,
                                                            packed: Path) -> None:
        """A manifest without a version, or a template that can't render, is refused by name."""
        (packed / "release.toml").write_text('workload = []\n')
        with pytest.raises(ReleaseError, match="has no `version`"):
            add(packed, world.node)
        (packed / "release.toml").write_text('version = "2.0.0"\n')
        (packed / "assets" / "recovery.sh").write_text("${oops}\n")
        with pytest.raises(AssetError, match="unknown or malformed placeholder"):
            add(packed, world.node)
        assert world.node.effectors.releases.versions() == []

    def test_stored_manifest_must_match_its_directory(self, world: World) -> None:
        """A stored release whose manifest names another version is refused when used."""
        world.add_release("1.0.0")
        (world.paths.releases_dir / "1.0.0" / "release.toml").write_text('version = "1.0.1"\n')
        world.record_digest("1.0.0")
        with pytest.raises(ReleaseError, match=r"says version '1\.0\.1', but its directory is '1\.0\.0'"):
            world.node.controller.fire("install", release="1.0.0")

    def test_prune_keeps_selected_last_good_and_pending(self, world: World) -> None:
        """prune removes old releases but never the selected, the last-good or a pending one."""
        for v in ("0.9.0", "0.9.5"):
            world.add_release(v)
        world.installed("1.0.0")
        world.upgrading("2.0.0")
        assert prune(world.node).removed == ("0.9.0", "0.9.5")
        assert world.node.effectors.releases.versions() == ["1.0.0", "2.0.0"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed")
class TestUnitsVerify:
    def test_rendered_units_verify_without_warnings(self, tmp_path: Path, packed: Path) -> None:
        """The units a packed release writes pass `systemd-analyze verify` with exit 0 and no
        output on stderr (warnings there mean a typo systemd would ignore)."""
        base = tmp_path / "host"
        config = Config(name="agentx", state_dir=base / "state", lib_dir=base / "lib",
                        unit_dir=base / "units", run_dir=Path("/run/agentx-never-written"),
                        bin_link=base / "bin" / "agent-fsm")
        node = open_node(config, None, systemd=FakeSystemd(), publisher=FakePublisher(),
                         clock=FakeClock())
        add(packed, node)
        node.controller.fire("install", release="2.0.0")
        units = sorted((base / "units").glob("*.service"))
        assert [u.name for u in units] == ["agentx-recovery.service", "agentx.service"]
        proc = subprocess.run(["systemd-analyze", "verify", "--man=no", *map(str, units)],
                              capture_output=True, text=True, check=False, cwd=base)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
