"""`agent-fsm` on PATH: the config's `bin_link`, kept by every asset write, never over a file
that is not agent-fsm's own link."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent_fsm.actions.operations import activate, install
from agent_fsm.errors import ConfigError
from agent_fsm.node import config as config_mod
from agent_fsm.views.doctor.checks import doctor
from tests.helpers import DEFAULT_CONFIG, World, make_world


def link_of(world: World) -> Path:
    return world.root / "usr" / "local" / "bin" / "agent-fsm"


def leads_to(world: World, link: Path) -> Path:
    """Where the link leads on the host (below the root): the launcher it runs, resolved."""
    target = Path(os.readlink(link))
    assert target.is_absolute(), target  # a host path, as the units name them
    return world.paths.real(target).resolve()


def launcher(world: World, version: str) -> Path:
    return (world.paths.releases_dir / version / "bin" / "agent-fsm").resolve()


def finding(world: World) -> tuple[str, str, str]:
    found = [f for f in doctor(world.node, check_systemd=False) if f.check == "link on PATH"]
    assert len(found) == 1, found
    return found[0].level, found[0].detail, found[0].fix


class TestKept:
    def test_install_puts_the_selected_release_on_path(self, world: World) -> None:
        """install writes the link (below --root), leading through `selected` to the selected
        release's launcher, and says so."""
        world.add_release("1.0.0")
        done = install(world.node, "1.0.0")
        link = link_of(world)
        assert link.is_symlink()
        assert os.readlink(link) == "/var/lib/agent-fsm/selected/bin/agent-fsm"
        assert leads_to(world, link) == launcher(world, "1.0.0")
        assert f"agent-fsm on PATH: {link}" in done.message
        assert finding(world)[0] == "ok"

    def test_activate_rewrites_a_missing_link(self, world: World) -> None:
        """A link removed since install is back after `activate`, leading to the activated
        release."""
        world.installed("1.0.0")
        world.add_release("2.0.0")
        link_of(world).unlink()
        assert finding(world)[0] == "warn"
        done = activate(world.node, "2.0.0")
        assert leads_to(world, link_of(world)) == launcher(world, "2.0.0")
        assert "agent-fsm on PATH" in done.message

    def test_a_daemon_start_rewrites_a_stale_link(self, world: World) -> None:
        """agent-fsm's own link to another state dir's launcher is rewritten at the next start
        of the agent (`settle`), and doctor reported it meanwhile."""
        world.installed("1.0.0")
        link = link_of(world)
        link.unlink()
        link.symlink_to("/var/lib/old-state/selected/bin/agent-fsm")
        level, detail, fix = finding(world)
        assert level == "warn" and "/var/lib/old-state" in detail and fix
        world.node.controller.fire("settle")
        assert leads_to(world, link) == launcher(world, "1.0.0")

    def test_recovery_leaves_it_running_the_last_good(self, world: World) -> None:
        """During and after a rollback the link runs the last-good's launcher; `recovered`
        writes it if it went missing."""
        world.installed("1.0.0").upgrading("2.0.0")
        assert leads_to(world, link_of(world)) == launcher(world, "2.0.0")
        world.node.controller.fire("recover")
        assert leads_to(world, link_of(world)) == launcher(world, "1.0.0")
        link_of(world).unlink()
        world.node.controller.fire("recovered")
        assert leads_to(world, link_of(world)) == launcher(world, "1.0.0")


class TestNotOurs:
    @pytest.mark.parametrize("kind", ["file", "link"])
    def test_something_else_there_is_left_alone(self, world: World, kind: str) -> None:
        """A file, or a link that is not agent-fsm's, is never overwritten: install goes on,
        says so, and doctor warns in one line with the fix."""
        link = link_of(world)
        link.parent.mkdir(parents=True)
        if kind == "file":
            link.write_text("#!/bin/sh\necho pip's agent-fsm\n")
        else:
            link.symlink_to("/opt/other/agent-fsm")
        before = (link.read_bytes() if kind == "file" else os.readlink(link))
        world.add_release("1.0.0")
        done = install(world.node, "1.0.0")
        assert (link.read_bytes() if kind == "file" else os.readlink(link)) == before
        assert "not agent-fsm's link: left alone" in done.message
        level, detail, fix = finding(world)
        assert level == "warn" and str(link) in detail
        assert "remove it" in fix and "\n" not in detail + fix

    def test_a_file_in_the_links_path_is_a_warning_not_a_crash(self, world: World) -> None:
        """A file where the link's directory should be: install goes on, doctor warns."""
        (world.root / "usr" / "local").mkdir(parents=True)
        (world.root / "usr" / "local" / "bin").write_text("not a directory\n")
        world.add_release("1.0.0")
        done = install(world.node, "1.0.0")
        assert "left alone" in done.message
        level, detail, _ = finding(world)
        assert level == "warn" and "Not a directory" in detail


class TestConfig:
    def test_empty_means_no_link(self, tmp_path: Path) -> None:
        """`bin_link = ""`: install writes no link, and doctor says there is none."""
        world = make_world(tmp_path, DEFAULT_CONFIG._replace(bin_link=None))
        world.add_release("1.0.0")
        done = install(world.node, "1.0.0")
        assert not (tmp_path / "usr" / "local" / "bin").exists()
        assert "PATH" not in done.message
        assert finding(world) == ("ok", 'no link on PATH (`bin_link = ""` in the config)', "")

    def test_another_path(self, tmp_path: Path) -> None:
        """`bin_link` names where the link goes, below the root like every path."""
        config = config_mod.parse({"bin_link": "/opt/bin/agent-fsm"}, tmp_path / "c.toml")
        world = make_world(tmp_path, config)
        world.add_release("1.0.0")
        install(world.node, "1.0.0")
        assert leads_to(world, tmp_path / "opt" / "bin" / "agent-fsm") == launcher(world, "1.0.0")

    @pytest.mark.parametrize("value", ["bin/agent-fsm", "/usr/local/bin/", 7])
    def test_refused_at_load(self, tmp_path: Path, value: object) -> None:
        """A relative, non-normalized or non-string `bin_link` is refused, naming the key."""
        with pytest.raises(ConfigError, match="`bin_link`"):
            config_mod.parse({"bin_link": value}, tmp_path / "c.toml")

    def test_kept_with_the_last_goods_settings(self, tmp_path: Path) -> None:
        """The way back's kept settings carry `bin_link`, "" included."""
        for link in (None, Path("/opt/bin/agent-fsm")):
            config = DEFAULT_CONFIG._replace(bin_link=link)
            table = config_mod.to_table(config)
            assert config_mod.parse(table, tmp_path / "c.toml").bin_link == link

