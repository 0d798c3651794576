"""The store keeps each byte once: identical files of stored releases are one file,
hard-linked; damage is reported where it is; prune frees what no release uses, nothing else."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from agent_fsm.actions.releases import abi
from agent_fsm.actions.releases.packing import add, pack
from agent_fsm.actions.releases.pruning import prune
from agent_fsm.actions.releases.vendoring import BOOT_FILE, boot, launcher
from agent_fsm.errors import ReleaseError
from agent_fsm.node.releases import hashes as release_hashes
from agent_fsm.node.releases import objects as release_objects
from agent_fsm.node.releases import store as release_store
from agent_fsm.node.releases import tree as release_tree
from agent_fsm.node.releases.tree import scan
from agent_fsm.views.doctor.checks import doctor
from tests.helpers import World
from tests.node.test_release_store import _flip_a_byte_keeping_times, leftovers, make_release

SHARED = "assets/agent.service"  # a file every release made by `make_release` holds


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pack("1.0.0", tmp_path_factory.mktemp("packed") / "rel")


def variant(packed: Path, where: Path, version: str) -> Path:
    """`packed` as another version with a small payload of its own: its release.toml, launcher
    and payload differ, the rest (agent-fsm and its libraries) is the same bytes."""
    rel = where / f"rel-{version}"
    shutil.copytree(packed, rel)
    (rel / "release.toml").write_text(f'version = "{version}"\n')
    need = abi.read(rel)
    (rel / "bin" / "agent-fsm").write_text(launcher(version))
    (rel / "lib" / BOOT_FILE).write_text(boot(version, need.targets if need else ("any",)))
    (rel / "payload").mkdir()
    (rel / "payload" / "agent.sh").write_text(f"#!/bin/sh\necho agent {version}\n")
    (rel / "payload" / "agent.sh").chmod(0o755)
    return rel


def source_digest(directory: Path) -> str:
    """The digest the store should record for `directory`: its normalized manifest's."""
    entries = scan(directory, stored=False, normalize=True)
    return release_store.digest(release_store.manifest(entries))


def problems(world: World) -> dict[str, str | None]:
    releases = world.node.releases
    return {v: releases.integrity(v).problem for v in releases.versions()}


def objects_of(world: World) -> list[Path]:
    return sorted((world.paths.releases_dir / release_objects.OBJECTS).iterdir())



def files_read(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The release-relative names of the files the store reads from now on, in order."""
    read: list[str] = []
    real = release_tree.Reader._opened  # every open of a file to read it

    def counted(self: release_tree.Reader, *args: object) -> tuple[int, int]:
        read.append(str(args[3]))
        return real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(release_tree.Reader, "_opened", counted)
    return read


def records_read(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The versions whose hashes record the store reads from now on, in order."""
    read: list[str] = []
    real = release_hashes._hashed_record

    def counted(releases_dir: Path, version: str) -> bytes | None:
        read.append(version)
        return real(releases_dir, version)

    monkeypatch.setattr(release_hashes, "_hashed_record", counted)
    return read


class TestTenReleases:
    def test_ten_releases_cost_well_under_twice_one(self, packed: Path, world: World,
                                                    tmp_path: Path) -> None:
        """Ten releases of agent-fsm, each with its own small payload, take under twice the
        disk one of them takes (the ratio is printed), each intact with its source's digest."""
        releases_dir = world.paths.releases_dir
        digests = {}
        for i in range(10):
            rel = variant(packed, tmp_path, f"1.{i}.0")
            digests[f"1.{i}.0"] = add(rel, world.node).digest
            if i == 0:
                one = release_objects.usage(releases_dir)
                assert digests["1.0.0"] == source_digest(rel)
        ten = release_objects.usage(releases_dir)
        print(f"\nstore of ten releases: {ten / 1e6:.1f} MB, one: {one / 1e6:.1f} MB, "
              f"ratio {ten / one:.2f}")
        assert ten / one < 2
        releases = world.reopen().node.releases
        assert {v: releases.verify(v).digest for v in digests} == digests
        assert leftovers(world) == []


class TestDamage:
    @pytest.fixture
    def three(self, world: World, tmp_path: Path) -> World:
        for v in ("1.0.0", "2.0.0", "3.0.0"):
            add(make_release(tmp_path, v, marker=v), world.node)
        return world

    def test_files_the_same_in_releases_are_one_file(self, three: World) -> None:
        """A file with the same bytes and mode in three releases is one file on disk, linked from
        each release and the store's objects, mode 0644 and ours."""
        paths = [three.paths.releases_dir / v / SHARED for v in ("1.0.0", "2.0.0", "3.0.0")]
        inodes = {p.stat().st_ino for p in paths}
        assert len(inodes) == 1 and paths[0].stat().st_nlink == 4
        assert paths[0].stat().st_mode & 0o7777 == 0o644
        assert paths[0].stat().st_uid == os.geteuid()

    def test_a_file_replaced_in_one_release_damages_that_release_only(self, three: World) -> None:
        """A shared file replaced by a new file in one stored release (an editor's save) is
        DAMAGED in that release; the others stay intact."""
        target = three.paths.releases_dir / "2.0.0" / SHARED
        new = target.with_name("agent.service.new")
        new.write_text(target.read_text() + "# edited\n")
        new.chmod(0o644)
        os.replace(new, target)
        found = problems(three)
        assert found["1.0.0"] is None and found["3.0.0"] is None
        assert found["2.0.0"] is not None and f"{SHARED} changed content" in found["2.0.0"]

    def test_mending_a_replaced_file_lists_none_of_the_stores_objects(
            self, three: World, monkeypatch: pytest.MonkeyPatch) -> None:
        """The way back mends a shared file replaced in its release from an intact copy without
        listing the store's objects (what it costs does not grow with the store); the release
        verifies again."""
        target = three.paths.releases_dir / "2.0.0" / SHARED
        new = target.with_name("agent.service.new")
        new.write_text(target.read_text() + "# edited\n")
        new.chmod(0o644)
        os.replace(new, target)
        listed: list[object] = []
        real = release_objects.Names.__init__
        monkeypatch.setattr(release_objects.Names, "__init__",
                            lambda self, where=None: listed.append(where) or real(self, where))
        with three.node.store.locked():
            fixed = three.node.releases.mend("2.0.0")
        assert [rel for rel, _ in fixed] == [SHARED] and listed == [None]
        three.reopen().node.releases.reread("2.0.0")

    def test_a_file_unique_to_one_release_changed_damages_that_release_only(
            self, three: World) -> None:
        """A file only one release holds, written in place, is DAMAGED in that release only."""
        launcher_file = three.paths.releases_dir / "3.0.0" / "bin" / "agent-fsm"
        assert launcher_file.stat().st_nlink == 2  # its release and its object
        with launcher_file.open("ab") as f:
            f.write(b"# edited\n")
        found = problems(three)
        assert found["1.0.0"] is None and found["2.0.0"] is None
        assert found["3.0.0"] is not None and "bin/agent-fsm changed content" in found["3.0.0"]

    def test_a_shared_file_written_in_place_damages_every_sharer_and_says_why(
            self, three: World, tmp_path: Path) -> None:
        """Bytes written in place into a shared file damage every release that links it, each
        report saying the file is shared; adding one again mends that one with a new object."""
        with (three.paths.releases_dir / "1.0.0" / SHARED).open("ab") as f:
            f.write(b"# edited in place\n")
        found = problems(three)
        assert all(found.values()), found
        assert all("names in the store" in str(p) and "add each damaged release again" in str(p)
                   for p in found.values())
        again = add(make_release(tmp_path / "again", "2.0.0", marker="2.0.0"), three.node)
        assert again.replaced is not None
        found = problems(three)
        assert found["2.0.0"] is None and found["1.0.0"] and found["3.0.0"]
        assert leftovers(three) == []

    def test_doctor_fails_each_release_a_shared_write_damaged_and_says_why(
            self, three: World) -> None:
        """`doctor` hashes every stored release and fails each one a write in place into a
        shared file damaged, saying the file is shared and how to mend it."""
        with (three.paths.releases_dir / "3.0.0" / SHARED).open("ab") as f:
            f.write(b"# edited in place\n")
        findings = doctor(three.node, check_systemd=False)
        failed = [f for f in findings if f.check == "release"]
        assert len(failed) == 3 and all(f.level == "fail" for f in failed)
        assert all("names in the store" in f.detail and "release add" in f.fix for f in failed)
        summary = next(f for f in findings if f.check == "releases")
        assert summary.level == "warn" and "3 stored, 3 damaged" in summary.detail

    def test_doctor_reads_a_file_three_releases_share_once(
            self, three: World, monkeypatch: pytest.MonkeyPatch) -> None:
        """`doctor` hashes every release whole, but a file three releases share (one inode,
        unchanged) is read once, not three times."""
        monkeypatch.setattr(release_tree, "_SETTLED_NS", 0)  # as if stored long ago
        read = files_read(monkeypatch)
        findings = doctor(three.node, check_systemd=False)
        assert next(f for f in findings if f.check == "releases").level == "ok"
        assert read.count(SHARED) == 1 and read.count("bin/agent-fsm") == 3

    def test_a_whole_check_keeps_only_shared_files_for_the_next_release(
            self, three: World, monkeypatch: pytest.MonkeyPatch) -> None:
        """`release list` and `doctor` keep, between the releases they hash, only the files
        another release links too: a release's own files are not held (a release of 100,000s
        of them would be), the shared one is, and is read once."""
        monkeypatch.setattr(release_tree, "_SETTLED_NS", -1)  # every file's times settled
        seen: release_tree.Hashed = {}
        assert three.node.releases.integrity("1.0.0", seen).problem is None
        kept = {rel for rel, _ in seen}
        assert SHARED in kept and "release.toml" not in kept
        read = files_read(monkeypatch)
        assert three.node.releases.integrity("2.0.0", seen).problem is None
        assert SHARED not in read and "release.toml" in read

    def test_an_add_never_links_an_object_whose_bytes_changed(self, three: World,
                                                               tmp_path: Path) -> None:
        """With the stored copy of a file damaged in place, a new release holding that file is
        stored with the source's bytes and digest, not the damaged ones."""
        with (three.paths.releases_dir / "1.0.0" / SHARED).open("ab") as f:
            f.write(b"# bit rot\n")
        rel = make_release(tmp_path / "new", "4.0.0", marker="4.0.0")
        done = add(rel, three.node)
        assert done.digest == source_digest(rel)
        stored = three.paths.releases_dir / "4.0.0" / SHARED
        assert stored.read_bytes() == (rel / SHARED).read_bytes()
        assert problems(three)["4.0.0"] is None


class TestFastCheck:
    def test_releases_sharing_files_are_checked_without_reading_them_after_adds_and_prunes(
            self, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """After later adds link a release's files and a prune unlinks some of their names (each
        moving the files' ctime), a new process still checks every kept release by its stat,
        reading no file; a file then changed is still found."""
        for v in ("1.0.0", "2.0.0", "3.0.0"):
            add(make_release(tmp_path, v, marker=v), world.node)
        world.node.controller.fire("install", release="3.0.0")
        assert prune(world.node, ("1.0.0",)).freed.files == 2
        read = files_read(monkeypatch)
        releases = world.reopen().node.releases
        releases.verify("2.0.0")
        releases.verify("3.0.0")
        assert read == []
        _flip_a_byte_keeping_times(world.paths.releases_dir / "2.0.0" / SHARED)
        assert "changed content" in str(world.reopen().node.releases.integrity("3.0.0").problem)
        with pytest.raises(ReleaseError, match="changed content"):
            world.reopen().node.releases.verify("2.0.0")

    def test_a_tidy_reads_no_record_when_no_stored_file_moved(
            self, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """The tidy after an add reads the releases' hashes records only when the add linked a
        stored file (moving its ctime): with nothing moved since, it reads none, and a new
        process still checks each release reading no file."""
        for v in ("1.0.0", "2.0.0"):
            add(make_release(tmp_path, v, marker=v), world.node)
        records = records_read(monkeypatch)
        release_store.tidy(world.paths.releases_dir, world.node.store.locked)
        assert records == []
        add(make_release(tmp_path, "3.0.0", marker="3.0.0"), world.node)  # links SHARED
        assert sorted(set(records)) == ["1.0.0", "2.0.0", "3.0.0"]
        read = files_read(monkeypatch)
        for v in ("1.0.0", "2.0.0", "3.0.0"):
            world.reopen().node.releases.verify(v)
        assert read == []

    def test_an_add_sharing_nothing_reads_no_record_and_one_sharing_refreshes_the_others(
            self, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """The first add, whose release holds the same bytes twice, reads no hashes record in
        its tidy; the next add, which links files the first release holds, refreshes that
        release's record. After each, a new process checks every release reading no file."""
        records = records_read(monkeypatch)
        first = make_release(tmp_path, "1.0.0", marker="1.0.0")
        for name in ("a.txt", "b.txt", "c.txt"):  # one object, three names
            (first / "assets" / name).write_text("the same bytes\n")
        add(first, world.node)
        assert records == []
        read = files_read(monkeypatch)
        world.reopen().node.releases.verify("1.0.0")
        assert read == []
        add(make_release(tmp_path, "2.0.0", marker="2.0.0"), world.node)  # links SHARED
        assert "1.0.0" in records
        read.clear()  # what the add read
        for v in ("1.0.0", "2.0.0"):
            world.reopen().node.releases.verify(v)
        assert read == []


class TestPrune:
    def test_prune_frees_what_no_release_uses_and_never_what_a_kept_one_does(
            self, world: World, tmp_path: Path) -> None:
        """Pruning a release frees the files only it held; the files a kept release holds stay
        in the store, so a later release holding them shares them again."""
        for v in ("1.0.0", "2.0.0"):
            add(make_release(tmp_path, v, marker=v), world.node)
        world.node.controller.fire("install", release="2.0.0")
        before = len(objects_of(world))
        pruned = prune(world.node)
        assert pruned.removed == ("1.0.0",)
        assert pruned.freed.files == 2  # 1.0.0's launcher and release.toml
        assert len(objects_of(world)) == before - 2
        assert leftovers(world) == [] and problems(world) == {"2.0.0": None}
        add(make_release(tmp_path / "later", "3.0.0", marker="3.0.0"), world.node)
        kept, later = (world.paths.releases_dir / v / SHARED for v in ("2.0.0", "3.0.0"))
        assert kept.stat().st_ino == later.stat().st_ino

    def test_prune_frees_what_an_older_prune_left(self, world: World, tmp_path: Path) -> None:
        """A release removed without freeing its files (an older agent-fsm's prune deletes the
        tree alone) costs nothing after the next prune."""
        for v in ("1.0.0", "2.0.0"):
            add(make_release(tmp_path, v, marker=v), world.node)
        world.node.controller.fire("install", release="2.0.0")
        shutil.rmtree(world.paths.releases_dir / "1.0.0")
        release_store.forget(world.paths.releases_dir, "1.0.0")
        assert len(leftovers(world)) == 2
        assert prune(world.node).freed.files == 2
        assert leftovers(world) == []


    def _killed_prune_of_1(self, world: World, tmp_path: Path) -> None:
        """1.0.0 and 2.0.0 stored, 2.0.0 installed; a prune killed just after taking 1.0.0 out
        of the store (its tree hidden as `.1.0.0.pruning`, not deleted yet)."""
        for v in ("1.0.0", "2.0.0"):
            add(make_release(tmp_path, v, marker=v), world.node)
        world.node.controller.fire("install", release="2.0.0")
        where = world.paths.releases_dir
        os.rename(where / "1.0.0", where / ".1.0.0.pruning")
        release_store.forget(where, "1.0.0")

    def test_an_add_frees_what_a_killed_prune_left(self, world: World, tmp_path: Path) -> None:
        """The tree a prune killed midway had taken out of the store, and the files only it
        held, are freed by the next add as by the next prune (docs/state-files.md)."""
        self._killed_prune_of_1(world, tmp_path)
        add(make_release(tmp_path / "later", "3.0.0", marker="3.0.0"), world.node)
        assert leftovers(world) == []
        assert problems(world) == {"2.0.0": None, "3.0.0": None}

    def test_a_release_added_again_after_a_killed_prune_can_be_pruned(
            self, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A version whose prune was killed midway, added again (that add killed too, after
        storing it, before its housekeeping) and pruned again, is removed with nothing left,
        not refused because the killed prune's tree still has its hidden name."""
        self._killed_prune_of_1(world, tmp_path)
        with monkeypatch.context() as m:
            m.setattr(release_store, "tidy", lambda *_a: release_objects.Collected())
            add(tmp_path / "rel-1.0.01.0.0", world.node)
        assert (world.paths.releases_dir / ".1.0.0.pruning").is_dir()
        assert prune(world.node).removed == ("1.0.0",)
        assert leftovers(world) == [] and problems(world) == {"2.0.0": None}


class TestBigFiles:
    """A file over the size read whole (1 MiB) is streamed into the store: read once, and
    still kept once across releases."""

    BIG = "payload/big.bin"

    def _with_big(self, where: Path, version: str, data: bytes) -> Path:
        rel = make_release(where, version, marker=version)
        (rel / "payload").mkdir()
        (rel / self.BIG).write_bytes(data)
        return rel

    def test_a_big_file_is_read_once_and_kept_once_across_releases(
            self, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """`release add` reads each source file once, and a second release holding the same
        3 MiB file links the stored one: one inode, the store grows by far less than it."""
        data = os.urandom(3 << 20)
        first = self._with_big(tmp_path, "1.0.0", data)
        expected = source_digest(first)
        read = files_read(monkeypatch)
        assert add(first, world.node).digest == expected
        assert read.count(self.BIG) == 1 and read.count(SHARED) == 1
        used = release_objects.usage(world.paths.releases_dir)
        second = self._with_big(tmp_path, "2.0.0", data)
        assert add(second, world.node).digest == source_digest(second)
        stored = [os.lstat(world.paths.releases_dir / v / self.BIG) for v in ("1.0.0", "2.0.0")]
        assert stored[0].st_ino == stored[1].st_ino
        assert release_objects.usage(world.paths.releases_dir) - used < len(data) // 4
        assert problems(world) == {"1.0.0": None, "2.0.0": None}

    def test_a_big_file_whose_stored_copy_was_damaged_is_stored_anew(
            self, world: World, tmp_path: Path) -> None:
        """With the stored copy of a big file damaged in place, a new release holding it is
        stored with the source's bytes in a file of its own, and checks intact."""
        data = os.urandom(3 << 20)
        add(self._with_big(tmp_path, "1.0.0", data), world.node)
        with (world.paths.releases_dir / "1.0.0" / self.BIG).open("r+b") as f:
            f.write(b"rot")
        second = self._with_big(tmp_path, "2.0.0", data)
        assert add(second, world.node).digest == source_digest(second)
        stored = world.paths.releases_dir / "2.0.0" / self.BIG
        assert stored.read_bytes() == data
        assert os.lstat(stored).st_ino != os.lstat(world.paths.releases_dir / "1.0.0"
                                                    / self.BIG).st_ino
        assert problems(world)["2.0.0"] is None
