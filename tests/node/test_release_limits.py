"""How big a release the store takes: ceilings from the host's config (`[store]`), with defaults
that take real agents."""

from __future__ import annotations

import os
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_fsm.actions.releases.packing import add
from agent_fsm.actions.releases.sources import add_source
from agent_fsm.errors import ConfigError, NoRoom
from agent_fsm.node import config as config_mod
from agent_fsm.node.releases import room
from agent_fsm.node.store_config import StoreConfig
from tests.actions.test_payload import cli
from tests.actions.test_sources import nothing_stored
from tests.actions.test_tarstream import release_add
from tests.helpers import World, make_world
from tests.node.test_release_store import make_release

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mounts a small tmpfs)")


class TestDefaultCeilings:
    def test_a_release_with_one_150_mb_file_is_stored(self, world: World, tmp_path: Path) -> None:
        """A 150 MB binary (sparse here: it costs no disk, and hashing it reads 150 MB) is
        stored under the default ceilings, byte for byte."""
        rel = make_release(tmp_path)
        (rel / "payload").mkdir()
        with open(rel / "payload" / "agent", "wb") as f:
            f.truncate(150_000_000)
            f.seek(150_000_000 - 4)
            f.write(b"end\n")
        added = add(rel, world.node)
        big = added.path / "payload" / "agent"
        assert big.stat().st_size == 150_000_000
        with open(big, "rb") as f:
            f.seek(150_000_000 - 4)
            assert f.read() == b"end\n"

    def test_a_release_of_20000_files_is_stored(self, world: World, tmp_path: Path) -> None:
        """A payload of 20,000 small files (a node_modules) is stored under the default
        ceilings, every file in it."""
        rel = make_release(tmp_path)
        for d in range(100):
            where = rel / "payload" / f"m{d}"
            where.mkdir(parents=True)
            for i in range(200):
                (where / f"f{i}.js").write_text(f"module.exports = {d * 200 + i};\n")
        added = add(rel, world.node)
        assert sum(1 for _ in (added.path / "payload").rglob("*.js")) == 20_000
        assert (added.path / "payload" / "m99" / "f199.js").read_text() == \
            "module.exports = 19999;\n"

    def test_the_defaults_take_a_4_gb_agent_of_500000_files(self) -> None:
        """The defaults hold an agent of 4 GB in 500,000 files beside agent-fsm's own."""
        limits = StoreConfig()
        assert limits.max_release_bytes >= 4_000_000_000 + (64 << 20)
        assert limits.max_file_bytes >= 4_000_000_000
        assert limits.max_release_files >= 500_000 + 2_000


class TestConfiguredCeilings:
    def test_the_store_table_is_read_from_the_config(self, tmp_path: Path) -> None:
        """`[store]` keys set the ceilings; the others keep their defaults."""
        cfg = tmp_path / "config.toml"
        cfg.write_text("[store]\nmax_file_bytes = 1048576\n")
        assert config_mod.load(cfg).store == StoreConfig(max_file_bytes=1 << 20)

    @pytest.mark.parametrize("value", ["0", "-1", "1.5", '"1G"', "true"])
    def test_a_ceiling_that_is_not_a_positive_integer_is_refused(self, tmp_path: Path,
                                                                 value: str) -> None:
        """A ceiling of 0, below it, fractional, a string or a boolean is refused at load,
        naming the key."""
        cfg = tmp_path / "config.toml"
        cfg.write_text(f"[store]\nmax_release_bytes = {value}\n")
        with pytest.raises(ConfigError, match=r"store\.max_release_bytes"):
            config_mod.load(cfg)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 100 MiB tmpfs in the test's directory, unmounted at the end."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=100m", "tmpfs", str(disk)], check=True,
                   timeout=30)
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True, timeout=30)


def _free(world: World) -> int:
    st = os.statvfs(world.paths.state_dir)
    return st.f_bfree * st.f_frsize


def _with_file(where: Path, version: str, size: int, name: str = "agent") -> Path:
    """A release whose payload holds one file of `size` bytes (sparse: no disk here)."""
    rel = make_release(where, version)
    (rel / "payload").mkdir()
    with open(rel / "payload" / name, "wb") as f:
        f.truncate(size)
    return rel


@as_root
class TestDisk:
    def test_a_release_that_does_not_fit_is_refused_before_a_byte_is_copied(
            self, small_disk: Path, tmp_path: Path) -> None:
        """A 40 MB release on a 100 MiB disk, which keeps 64 MiB for the way back, is refused
        in one line saying what it needs, what is free and what is kept, and the disk is as it
        was: nothing copied, nothing left."""
        world = make_world(small_disk)
        world.paths.releases_dir.mkdir(parents=True)
        rel = _with_file(tmp_path, "1.0.0", 40 << 20)
        before = _free(world)
        with pytest.raises(NoRoom) as refused:
            add(rel, world.node)
        said = str(refused.value)
        assert said.startswith(f"release {rel} needs 40 MiB; {world.paths.state_dir} has "), said
        assert " free and keeps 64 MiB for the way back; free space or prune: `agent-fsm " \
            "release prune`; nothing was stored" in said and "\n" not in said
        assert _free(world) == before and nothing_stored(world)

    def test_release_add_says_so_in_one_line_and_exits_1(self, small_disk: Path,
                                                         tmp_path: Path) -> None:
        """`agent-fsm release add` of a release that does not fit exits 1 with one line."""
        rel = _with_file(tmp_path, "1.0.0", 40 << 20)
        cfg = tmp_path / "config.toml"
        cfg.write_text('name = "agent"\n')
        done = cli("release", "add", str(rel), root=small_disk, config=cfg)
        assert done.returncode == 1, done.stderr
        assert done.stderr.count("\n") == 1 and "needs 40 MiB; " in done.stderr, done.stderr
        assert "keeps 64 MiB for the way back" in done.stderr

    def test_the_bytes_the_store_holds_are_not_needed_again(self, small_disk: Path,
                                                            tmp_path: Path) -> None:
        """A second release that shares its 30 MB file with the first is stored on a disk
        without room for 30 MB more: the store keeps those bytes once, and needs them once."""
        world = make_world(small_disk)
        add(_with_file(tmp_path, "1.0.0", 30 << 20), world.node)
        assert not room.room(world.paths.releases_dir).fits(30 << 20)
        rel = _with_file(tmp_path, "2.0.0", 30 << 20)
        (rel / "payload" / "config.json").write_text("{}\n")
        assert add(rel, world.node).version == "2.0.0"

    def test_an_archive_that_does_not_fit_is_refused_as_it_is_read(
            self, small_disk: Path, tmp_path: Path) -> None:
        """A small .tar.gz of a 50 MB release is refused at the member that would not fit the
        disk, before it is written, saying what was needed so far; nothing is left."""
        world = make_world(small_disk)
        world.paths.releases_dir.mkdir(parents=True)
        rel = _with_file(tmp_path, "1.0.0", 50 << 20)
        archive = tmp_path / "r.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(rel, arcname="myagent-1.0.0")
        before = _free(world)
        with pytest.raises(NoRoom, match=rf"^release archive {archive} needs at least 50 MiB; "
                           r".* free and keeps 64 MiB for the way back; free space or prune"):
            add_source(str(archive), world.node)
        assert _free(world) == before and nothing_stored(world)

    def test_a_disk_that_fills_mid_add_leaves_nothing_behind(
            self, small_disk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """When the disk fills while a release is copied (statvfs said there was room), the add
        fails in one line saying so, and leaves no staging copy, no half release and no object
        that no release links: the disk is as it was."""
        world = make_world(small_disk)
        world.paths.releases_dir.mkdir(parents=True)
        rel = _with_file(tmp_path, "1.0.0", 10 << 20, name="a")
        with open(rel / "payload" / "b", "wb") as f:
            f.write(os.urandom(1 << 20))
            f.truncate(120 << 20)  # the copy is dense: over the disk's 100 MiB
        roomy = os.statvfs_result((4096, 4096, 1 << 30, 1 << 30, 1 << 30, 1 << 20, 1 << 20,
                                   1 << 20, 0, 255))
        monkeypatch.setattr(room.os, "statvfs", lambda _: roomy)
        before = _free(world)
        with pytest.raises(NoRoom) as refused:
            add(rel, world.node)
        said = str(refused.value)
        assert said.startswith(f"could not store release {rel}: the disk of "
                               f"{world.paths.state_dir} filled while it was copied (No space "
                               "left on device); nothing was stored"), said
        assert "\n" not in said and "`agent-fsm release prune`" in said
        assert nothing_stored(world) and _free(world) == before


class TestMemory:
    def test_release_add_holds_little_more_for_each_file(self, tmp_path: Path) -> None:
        """`release add` of 20,000 small files peaks at most 1,000 bytes a file above the add
        of a small release: 100,000 files stay under 100 MB."""
        small = make_release(tmp_path / "small", "1.0.0")
        many = make_release(tmp_path / "many", "2.0.0")
        for d in range(100):
            where = many / "payload" / f"m{d}"
            where.mkdir(parents=True)
            for i in range(200):
                (where / f"f{i}.js").write_text(f"module.exports = {d * 200 + i};\n")
        peaks = []
        for rel in (small, many):
            code, stderr, _, rss = release_add(tmp_path, rel)
            assert code == 0, stderr
            peaks.append(rss)
        assert (peaks[1] - peaks[0]) / 20_000 < 1000, [p >> 20 for p in peaks]
