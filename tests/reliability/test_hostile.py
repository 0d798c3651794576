"""A hostile filesystem: planted symlinks, loose modes, foreign owners, failing disks."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent_fsm import files
from agent_fsm.errors import AgentFsmError, DiskError, UnsafePath
from tests.helpers import World


def _plant_link(at: Path, outside: Path) -> None:
    at.parent.mkdir(parents=True, exist_ok=True)
    outside.write_text("precious\n")
    at.symlink_to(outside)


class TestSymlinks:
    @pytest.mark.parametrize("which", ["agent_unit", "recovery_unit", "recovery_script"])
    def test_link_at_an_asset_path_is_refused(self, world: World, tmp_path: Path, which: str) -> None:
        """A symlink planted where an asset goes is refused; its target is not written."""
        world.add_release("1.0.0")
        outside = tmp_path / "outside.txt"
        _plant_link(getattr(world.paths, which), outside)
        with pytest.raises(UnsafePath, match="a symlink is planted there"):
            world.node.controller.fire("install", release="1.0.0")
        assert outside.read_text() == "precious\n"
        assert getattr(world.paths, which).is_symlink()

    def test_link_as_parent_directory_is_refused(self, world: World, tmp_path: Path) -> None:
        """A unit directory that is a symlink to elsewhere is refused; nothing lands there."""
        world.add_release("1.0.0")
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        unit_dir = world.paths.agent_unit.parent
        unit_dir.parent.mkdir(parents=True, exist_ok=True)
        unit_dir.symlink_to(elsewhere, target_is_directory=True)
        with pytest.raises(UnsafePath, match="the directory is a symlink"):
            world.node.controller.fire("install", release="1.0.0")
        assert list(elsewhere.iterdir()) == []

    def test_link_at_the_temporary_name_is_refused(self, world: World, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
        """A symlink planted at the temporary file's name is not followed."""
        monkeypatch.setattr(files, "_token", lambda: "fixed")
        outside = tmp_path / "outside.txt"
        target = tmp_path / "dir" / "state.json"
        _plant_link(target.parent / ".state.json.fixed.tmp", outside)
        with pytest.raises(UnsafePath, match="temporary name"):
            files.atomic_write(target, b"new\n")
        assert outside.read_text() == "precious\n" and not target.exists()

    def test_state_file_link_is_refused(self, world: World, tmp_path: Path) -> None:
        """A state.json replaced by a symlink is refused on the next transition."""
        world.installed("1.0.0")
        outside = tmp_path / "outside.txt"
        world.paths.state_file.unlink()
        _plant_link(world.paths.state_file, outside)
        with pytest.raises(AgentFsmError):
            world.node.controller.fire("settle")
        assert outside.read_text() == "precious\n"


class TestOwnershipAndModes:
    def test_world_writable_state_dir_is_refused(self, world: World) -> None:
        """A state directory others may write is refused, with the chmod that fixes it."""
        world.installed("1.0.0")
        world.paths.state_dir.chmod(0o777)
        with pytest.raises(UnsafePath, match=r"mode 0777.*chmod go-w"):
            world.node.controller.fire("settle")

    @pytest.mark.skipif(os.geteuid() != 0, reason="changing a directory's owner needs root")
    def test_foreign_owned_state_dir_is_refused(self, world: World) -> None:
        """A state directory owned by another user is refused."""
        world.installed("1.0.0")
        os.chown(world.paths.state_dir, 65534, 65534)
        with pytest.raises(UnsafePath, match="owned by uid 65534"):
            world.node.controller.fire("settle")

    @pytest.mark.parametrize("umask", [0o000, 0o077])
    def test_modes_exact_under_umask(self, world: World, umask: int) -> None:
        """State file, units, script and new directories get exact modes under any umask."""
        world.paths.state_dir.mkdir(parents=True)
        world.add_release("1.0.0")
        old = os.umask(umask)
        try:
            world.installed("1.0.0")
        finally:
            os.umask(old)
        modes = {p.name: p.stat().st_mode & 0o7777 for p in (
            world.paths.state_file, world.paths.agent_unit, world.paths.recovery_unit,
            world.paths.recovery_script, world.paths.state_dir, world.paths.agent_unit.parent)}
        assert modes == {"state.json": 0o644, "agent.service": 0o644,
                         "agent-recovery.service": 0o644, "agent-recovery.sh": 0o755,
                         "agent-fsm": 0o700, "system": 0o755}


class FailingDisk:
    """Makes the n-th call of one os function fail with an errno, once."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str, n: int, err: int) -> None:
        self.calls = 0
        self.failed_inode: int | None = None
        self.fsynced_after_failure: list[int] = []
        real: Callable[..., Any] = getattr(os, name)

        def fake(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if name == "fsync":
                ino = os.fstat(args[0]).st_ino
                if self.failed_inode == ino:
                    self.fsynced_after_failure.append(ino)
            if self.calls == n:
                if name == "fsync":
                    self.failed_inode = os.fstat(args[0]).st_ino
                raise OSError(err, os.strerror(err))
            return real(*args, **kwargs)

        monkeypatch.setattr(files.os, name, fake)


def _calls(world: World, name: str, monkeypatch: pytest.MonkeyPatch) -> int:
    """How many times the upgrade's transition calls os.<name>, on a copy of the world."""
    counter = FailingDisk(monkeypatch, name, 10**9, errno.EIO)
    world.node.controller.fire("begin_upgrade", release="2.0.0")
    monkeypatch.undo()
    return counter.calls


@pytest.mark.parametrize(("name", "err"), [("write", errno.ENOSPC), ("fsync", errno.EIO),
                                           ("replace", errno.EIO)])
def test_disk_errors_fail_cleanly_and_converge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               name: str, err: int) -> None:
    """EIO or ENOSPC at every write, fsync or rename of an upgrade's start fails the transition
    with a DiskError saying what to do (never retrying fsync on the same file), leaves no
    temporary file behind, and the next start finishes the upgrade."""
    from tests.helpers import make_world

    probe = make_world(tmp_path / "probe").installed("1.0.0")
    probe.add_release("2.0.0")
    total = _calls(probe, name, monkeypatch)
    assert total > 3
    for n in range(1, total + 1):
        world = make_world(tmp_path / f"{name}-{n}").installed("1.0.0")
        world.add_release("2.0.0")
        disk = FailingDisk(monkeypatch, name, n, err)
        with pytest.raises(DiskError, match=rf"{os.strerror(err)}.*run the command again"):
            world.node.controller.fire("begin_upgrade", release="2.0.0")
        monkeypatch.undo()
        assert disk.fsynced_after_failure == []
        leftovers = [p for p in world.root.rglob("*.tmp")]
        assert leftovers == [], leftovers
        again = world.reopen()
        doc = again.node.controller.resume()
        if doc.state == "converged":  # failed before the transition was recorded: do it again
            doc = again.node.controller.fire("begin_upgrade", release="2.0.0")
        assert doc.state == "candidate_running", n
        assert again.node.effectors.signal() is not None
        assert again.node.effectors.releases.selected() == "2.0.0"
