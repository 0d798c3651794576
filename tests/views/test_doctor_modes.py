"""`doctor` names every unsafe mode, owner and link of what root reads or runs, with its fix."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from agent_fsm.views.doctor import modes
from agent_fsm.views.doctor.checks import Finding, doctor
from tests.helpers import DEFAULT_CONFIG, World, make_world

MODE_CHECKS = {"state directory", "lock file", "state dir entries", "state dir link",
               "state dir entry", "state dir owner", "state dir mode", "state dir walk",
               "pointer", "asset", "asset modes", "unit directory", "script directory",
               "parent directory", "config file", "config directory", "config modes",
               "allowed signers"}
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")


def _fails(world: World) -> list[Finding]:
    return [f for f in doctor(world.node, check_systemd=False) if f.level == "fail"]


def _fix(world: World, check: str, path: Path) -> str:
    """The fix of the one failing `check` finding whose detail names `path`."""
    found = [f for f in _fails(world) if f.check == check and f"{path} " in f.detail]
    assert len(found) == 1, _fails(world)
    return found[0].fix


def _q(path: Path) -> str:
    return shlex.quote(str(path))


@pytest.fixture
def node(world: World) -> World:
    world.installed("1.0.0")
    world.add_release("2.0.0")
    return world


class TestCleanNode:
    def test_clean_node_has_no_mode_finding(self, node: World) -> None:
        """A freshly installed node has no failing mode, owner or link finding, and says so."""
        findings = doctor(node.node, check_systemd=False)
        assert [f for f in findings if f.level != "ok" and f.check in MODE_CHECKS] == []
        checks = {f.check for f in findings}
        assert {"state directory", "state dir entries", "asset modes"} <= checks

    def test_doctor_changes_nothing(self, node: World) -> None:
        """doctor reports a loose state directory and leaves it as it found it."""
        node.paths.state_dir.chmod(0o755)
        assert _fix(node, "state directory", node.paths.state_dir) == \
            f"chmod 0700 {_q(node.paths.state_dir)}"
        assert node.paths.state_dir.stat().st_mode & 0o777 == 0o755


class TestStateDir:
    def test_world_writable_state_dir(self, node: World) -> None:
        """A state directory others may write is a failure fixed with chmod 0700."""
        node.paths.state_dir.chmod(0o777)
        assert _fix(node, "state directory", node.paths.state_dir) == \
            f"chmod 0700 {_q(node.paths.state_dir)}"

    @as_root
    def test_foreign_state_dir(self, node: World) -> None:
        """A state directory another user owns is a failure fixed with chown."""
        os.chown(node.paths.state_dir, 65534, 65534)
        assert _fix(node, "state directory", node.paths.state_dir) == \
            f"chown {os.geteuid()} {_q(node.paths.state_dir)}"

    def test_readable_lock(self, node: World) -> None:
        """A lock other users may open is a failure fixed with chmod 0600."""
        node.paths.lock_file.chmod(0o644)
        assert _fix(node, "lock file", node.paths.lock_file) == \
            f"chmod 0600 {_q(node.paths.lock_file)}"

    def test_writable_template_deep_in_a_release(self, node: World) -> None:
        """A group-writable template inside a stored release is named with chmod go-w."""
        template = node.paths.releases_dir / "2.0.0" / "assets" / "agent.service"
        template.chmod(0o664)
        assert _fix(node, "state dir mode", template) == f"chmod go-w {_q(template)}"

    def test_setuid_file(self, node: World) -> None:
        """A setuid file in the state directory is named with chmod ug-s."""
        manifest = node.paths.releases_dir / "2.0.0" / "release.toml"
        manifest.chmod(0o4755)
        assert _fix(node, "state dir mode", manifest) == f"chmod ug-s {_q(manifest)}"

    @as_root
    def test_foreign_file(self, node: World) -> None:
        """A file another user owns in the state directory is named with chown."""
        os.chown(node.paths.state_file, 65534, 65534)
        assert _fix(node, "state dir owner", node.paths.state_file) == \
            f"chown -h {os.geteuid()} {_q(node.paths.state_file)}"

    def test_fifo(self, node: World) -> None:
        """A FIFO planted in the state directory is named with rm, and doctor does not block."""
        fifo = node.paths.state_dir / "results" / "x.json"
        fifo.parent.mkdir(exist_ok=True)
        os.mkfifo(fifo, 0o600)
        assert _fix(node, "state dir entry", fifo) == f"rm {_q(fifo)}"


class TestLinks:
    def test_planted_link_is_reported_not_followed(self, node: World, tmp_path: Path) -> None:
        """A symlink planted in a release is reported with rm; what it points at is not walked."""
        outside = tmp_path / "outside"
        (outside / "deep").mkdir(parents=True)
        (outside / "deep" / "loose").write_text("x")
        (outside / "deep" / "loose").chmod(0o666)
        link = node.paths.releases_dir / "2.0.0" / "bin"
        link.symlink_to(outside, target_is_directory=True)
        assert _fix(node, "state dir link", link) == f"rm {_q(link)}"
        assert not any("loose" in f.detail or "deep" in f.detail for f in _fails(node))
        assert (outside / "deep" / "loose").read_text() == "x"

    @pytest.mark.parametrize("target", ["/etc", "../../../../tmp", "releases/.digests",
                                        "releases/1.0.0/assets"])
    def test_pointer_outside_releases(self, node: World, target: str) -> None:
        """A `selected` pointer that leads anywhere but a stored release is a failure."""
        node.paths.selected.unlink()
        node.paths.selected.symlink_to(target)
        fix = _fix(node, "pointer", node.paths.selected)
        assert fix.startswith(f"ln -sfn releases/VERSION {_q(node.paths.selected)}")

    def test_pointer_to_missing_release(self, node: World) -> None:
        """A `last-good` pointer to a release that is not stored is a failure."""
        node.paths.last_good.unlink()
        node.paths.last_good.symlink_to("releases/9.9.9")
        assert "release add" in _fix(node, "pointer", node.paths.last_good)

    def test_pointers_inside_releases_pass(self, node: World) -> None:
        """Pointers at stored releases, relative or by their absolute host path, are fine."""
        node.paths.selected.unlink()
        node.paths.selected.symlink_to(node.node.config.state_dir / "releases" / "2.0.0")
        assert [f for f in _fails(node) if f.check == "pointer"] == []

    def test_state_dir_itself_a_link(self, node: World, tmp_path: Path) -> None:
        """A state directory replaced by a symlink is reported, not followed."""
        moved = tmp_path / "moved"
        node.paths.state_dir.rename(moved)
        node.paths.state_dir.symlink_to(moved, target_is_directory=True)
        (moved / "state.json").chmod(0o666)
        fails = _fails(node)
        assert _fix(node, "state directory", node.paths.state_dir).startswith(
            f"`rm {_q(node.paths.state_dir)}`")
        assert not any(f.check == "state dir mode" for f in fails)


class TestAssets:
    @pytest.mark.parametrize("which", ["agent_unit", "recovery_unit", "recovery_script"])
    def test_asset_link(self, node: World, tmp_path: Path, which: str) -> None:
        """An asset replaced by a symlink is named with rm."""
        asset: Path = getattr(node.paths, which)
        asset.unlink()
        asset.symlink_to(tmp_path / "elsewhere")
        assert _fix(node, "asset", asset).startswith(f"rm {_q(asset)}")

    def test_writable_asset(self, node: World) -> None:
        """A recovery script others may write is named with chmod go-w."""
        node.paths.recovery_script.chmod(0o777)
        assert _fix(node, "asset", node.paths.recovery_script) == \
            f"chmod go-w {_q(node.paths.recovery_script)}"

    @as_root
    def test_foreign_asset(self, node: World) -> None:
        """A unit another user owns is named with chown."""
        os.chown(node.paths.agent_unit, 65534, 65534)
        assert _fix(node, "asset", node.paths.agent_unit) == \
            f"chown {os.geteuid()} {_q(node.paths.agent_unit)}"

    @pytest.mark.parametrize(("which", "check"), [("agent_unit", "unit directory"),
                                                 ("recovery_script", "script directory")])
    def test_writable_asset_directory(self, node: World, which: str, check: str) -> None:
        """A unit or script directory others may write is named with chmod go-w, sticky or not."""
        directory = getattr(node.paths, which).parent
        directory.chmod(0o1777)
        assert _fix(node, check, directory) == f"chmod go-w {_q(directory)}"

    def test_writable_directory_above(self, node: World) -> None:
        """A directory above the unit directory that others may write is named; a sticky one
        (like /tmp) is not."""
        etc = node.root / "etc"
        etc.chmod(0o777)
        assert _fix(node, "parent directory", etc) == f"chmod go-w {_q(etc)}"
        etc.chmod(0o1777)
        assert [f for f in _fails(node) if f.check == "parent directory"] == []


class TestBounds:
    def test_walk_is_bounded(self, node: World, monkeypatch: pytest.MonkeyPatch) -> None:
        """The walk stops after MAX_ENTRIES entries and says so."""
        monkeypatch.setattr(modes, "MAX_ENTRIES", 5)
        walk = [f for f in doctor(node.node, check_systemd=False) if f.check == "state dir walk"]
        assert len(walk) == 1 and "stopped after 5 entries" in walk[0].detail

    def test_reports_are_capped(self, node: World, monkeypatch: pytest.MonkeyPatch) -> None:
        """Many unsafe entries give MAX_REPORTED findings and one that counts the rest."""
        monkeypatch.setattr(modes, "MAX_REPORTED", 2)
        for p in (node.paths.releases_dir / "2.0.0").rglob("*"):
            p.chmod(0o777)
        fails = [f for f in _fails(node) if f.check.startswith("state dir")]
        assert len(fails) == 3 and "3 more unsafe entries" in fails[-1].detail

    def test_hostile_name_is_quoted(self, node: World) -> None:
        """A planted name with a newline and `;` comes back as one shell word naming it."""
        name = "x;touch pwned\n$(id)'"
        planted = node.paths.state_dir / name
        planted.write_text("")
        planted.chmod(0o666)
        fix = next(f.fix for f in _fails(node) if f.check == "state dir mode")
        assert fix.startswith("chmod go-w $'")
        word = fix.removeprefix("chmod go-w ")
        out = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True,
                             check=True).stdout
        assert out == os.fsencode(planted)


class TestConfigFile:
    @pytest.fixture
    def configured(self, tmp_path: Path) -> tuple[World, Path]:
        """A node whose config file is the host's own, /etc/agent-fsm/config.toml below the root."""
        cfg = tmp_path / "root" / "etc" / "agent-fsm" / "config.toml"
        cfg.parent.mkdir(mode=0o755, parents=True)
        cfg.write_text('name = "agent"\n')
        cfg.chmod(0o644)
        world = make_world(tmp_path / "root", DEFAULT_CONFIG._replace(source=cfg))
        return world.installed("1.0.0"), cfg

    def test_safe_config_passes(self, configured: tuple[World, Path]) -> None:
        """A config file of root's, 0644, in a 0755 directory: no config finding fails."""
        world, _ = configured
        found = [f for f in doctor(world.node, check_systemd=False) if f.check.startswith("config")]
        assert [(f.check, f.level) for f in found] == [("config modes", "ok")]

    def test_writable_config_file(self, configured: tuple[World, Path]) -> None:
        """A config file others may write (0666) is a failure fixed with chmod go-w."""
        world, cfg = configured
        cfg.chmod(0o666)
        assert _fix(world, "config file", cfg) == f"chmod go-w {_q(cfg)}"

    def test_writable_config_directory(self, configured: tuple[World, Path]) -> None:
        """A directory above the config that others may write (0777) is a failure."""
        world, cfg = configured
        cfg.parent.chmod(0o777)
        assert _fix(world, "config directory", cfg.parent) == f"chmod go-w {_q(cfg.parent)}"

    @as_root
    def test_foreign_allowed_signers(self, configured: tuple[World, Path]) -> None:
        """An allowed-signers file another user owns is a failure fixed with chown."""
        world, cfg = configured
        signers = cfg.parent / "allowed_signers"
        signers.write_text("")
        os.chown(signers, 65534, 65534)
        world = make_world(world.root, world.node.config._replace(
            allowed_signers=Path("/etc/agent-fsm/allowed_signers")))
        assert _fix(world, "allowed signers", signers) == f"chown {os.geteuid()} {_q(signers)}"

    def _with_check(self, world: World, program: Path) -> World:
        """The node with a judgment check that runs `program` (named by its host path)."""
        judgment = world.node.config.judgment._replace(checks=((str(program), "--ok"),))
        return make_world(world.root, world.node.config._replace(judgment=judgment))

    def test_a_program_others_may_write_is_a_failure(self, configured: tuple[World, Path]) -> None:
        """A check root runs, writable by others (0777), is a failure fixed with chmod go-w;
        one of root's, 0755, passes."""
        world, cfg = configured
        program = cfg.parent / "check-health"
        program.write_text("#!/bin/sh\nexit 0\n")
        program.chmod(0o755)
        world = self._with_check(world, Path("/etc/agent-fsm/check-health"))
        found = [f for f in doctor(world.node, check_systemd=False) if f.check == "program"]
        assert found == []
        program.chmod(0o777)
        assert _fix(world, "program", program) == f"chmod go-w {_q(program)}"

    def test_a_missing_program_is_a_failure(self, configured: tuple[World, Path]) -> None:
        """A hook or check named by a path that does not exist is named: it could never run."""
        world, _ = configured
        world = self._with_check(world, Path("/etc/agent-fsm/nowhere"))
        found = [f for f in doctor(world.node, check_systemd=False) if f.check == "program"]
        assert [f.level for f in found] == ["fail"] and "does not exist" in found[0].detail
