"""What an operator sees of a big store: each release's own bytes on disk, the shared ones
once, the room left and the way back's reserve; and what a prune gives back."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent_fsm.actions.releases.packing import add
from agent_fsm.actions.releases.pruning import prune
from agent_fsm.node.releases import room, usage
from agent_fsm.node.store_config import size_text
from agent_fsm.views.doctor.checks import doctor
from agent_fsm.views.status.report import status
from tests.helpers import World, env_with_stub_systemctl
from tests.node.test_release_store import make_release

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20


def _release(where: Path, version: str, shared: bytes, own: int) -> Path:
    """A small release with `payload/shared` holding `shared` and `payload/own` `own` bytes
    of its own."""
    rel = make_release(where, version, marker=version)
    (rel / "payload").mkdir()
    (rel / "payload" / "shared").write_bytes(shared)
    (rel / "payload" / "own").write_bytes(os.urandom(own))
    return rel


def _du(*trees: Path) -> list[int]:
    """What `du` says each tree takes on disk, a file with several names counted once, in the
    first tree that holds it."""
    done = subprocess.run(["du", "-s", "--block-size=1", *map(str, trees)], capture_output=True,
                          text=True, check=True, timeout=60)
    return [int(line.split()[0]) for line in done.stdout.splitlines()]


@pytest.fixture
def two(world: World, tmp_path: Path) -> World:
    """1.0.0 and 2.0.0 stored, sharing 1 MiB of payload, 2.0.0 installed; 1.0.0 has 512 KiB
    of its own, 2.0.0 2 MiB."""
    shared = os.urandom(MIB)
    add(_release(tmp_path / "src", "1.0.0", shared, MIB // 2), world.node)
    add(_release(tmp_path / "src", "2.0.0", shared, 2 * MIB), world.node)
    world.node.controller.fire("install", release="2.0.0")
    return world


class TestStoreBytes:
    def test_shared_bytes_are_counted_once_and_each_release_counts_only_its_own(
            self, two: World) -> None:
        """Two releases sharing a file: the shared bytes are counted once, each release's bytes
        are only what it holds alone, and the total is what `du` says the store's releases
        take."""
        where = two.paths.releases_dir
        seen = usage.store_bytes(where)
        assert MIB <= seen.shared < MIB + 64 << 10
        assert 2 * MIB <= seen.releases["2.0.0"] < 2 * MIB + 64 << 10
        assert MIB // 2 <= seen.releases["1.0.0"] < MIB // 2 + 64 << 10
        first, second = _du(where / "1.0.0", where / "2.0.0")
        assert seen.total == first + second
        assert seen.releases["2.0.0"] == second  # du counted what they share in 1.0.0

    def test_status_json_has_the_store_with_free_space_and_reserve(self, two: World) -> None:
        """`status --json`'s store has the total, each release's and the shared bytes, and the
        free space and the way back's reserve of the state dir's file system, as numbers."""
        got = status(two.node).to_json()["store"]
        assert set(got) == {"total_bytes", "release_bytes", "shared_bytes", "free_bytes",
                            "reserve_bytes"}
        assert got == usage.store_bytes(two.paths.releases_dir).to_json() | {
            "free_bytes": got["free_bytes"]}
        assert set(got["release_bytes"]) == {"1.0.0", "2.0.0"}
        space = room.room(two.paths.releases_dir)
        assert got["reserve_bytes"] == space.reserve >= room.RESERVE_MIN
        assert isinstance(got["free_bytes"], int) and got["free_bytes"] > 0

    def test_human_status_says_the_store_in_one_line(self, two: World, tmp_path: Path) -> None:
        """`status` shows the store in one line: its size, how many releases, what they share,
        and what is free."""
        cfg = two.root.parent / "config.toml"
        cfg.write_text('name = "agent"\n[judgment]\ndeadline_seconds = 60\nsoak_seconds = 5\n')
        done = subprocess.run([sys.executable, "-m", "agent_fsm", "--config", str(cfg), "--root",
                               str(two.root), "status"], capture_output=True, text=True,
                              env=env_with_stub_systemctl(tmp_path), cwd=ROOT, timeout=60,
                              check=True)
        line = next(x for x in done.stdout.splitlines() if x.startswith("store "))
        assert re.fullmatch(r"store +3\.\d MiB \(2 releases, 1 MiB shared\), [\d.]+ [KMGT]iB free",
                            line), line

    def test_the_record_status_reads_is_the_walk_after_adds_and_prunes(self, two: World,
                                                                       tmp_path: Path) -> None:
        """Status reads the figures each add and prune records, and they are what a walk of the
        store finds then."""
        where = two.paths.releases_dir
        assert usage.seen(where).releases == usage.store_bytes(where).releases
        walked = usage.store_bytes(where)
        assert (where / usage.USAGE).read_text().splitlines() == [
            "agent-fsm store usage v1", f"shared {walked.shared}",
            *(f"release {n} {v}" for v, n in walked.releases.items())]
        prune(two.node)
        walked = usage.store_bytes(where)
        assert list(walked.releases) == ["2.0.0"] and walked.shared == 0
        assert (where / usage.USAGE).read_text().splitlines() == [
            "agent-fsm store usage v1", "shared 0", f"release {walked.releases['2.0.0']} 2.0.0"]
        assert usage.seen(where)[:2] == walked[:2]

    def test_the_first_add_records_what_a_walk_finds_without_walking(
            self, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """The first release added, holding the same bytes under three names and directories
        in directories, is recorded with the bytes a walk of the store finds (the copy's own
        count, no walk); the next add records the walk's figures again."""
        rel = _release(tmp_path / "src", "1.0.0", os.urandom(MIB), MIB // 2)
        for sub in ("a", "a/b", "a/b/c"):
            (rel / "payload" / sub).mkdir()
            (rel / "payload" / sub / "same").write_bytes(b"the same bytes\n" * 300)
        walks: list[list[str]] = []
        real = usage._walked
        monkeypatch.setattr(usage, "_walked", lambda d, v: walks.append(v) or real(d, v))
        add(rel, world.node)
        assert walks == []
        where = world.paths.releases_dir
        assert usage.seen(where)[:2] == usage.store_bytes(where)[:2]
        walks.clear()
        add(_release(tmp_path / "src", "2.0.0", os.urandom(MIB), MIB), world.node)
        assert walks == [["1.0.0", "2.0.0"]]
        assert usage.seen(where)[:2] == usage.store_bytes(where)[:2]

    def test_doctor_fails_when_less_is_free_than_the_way_back_keeps(
            self, two: World, monkeypatch: pytest.MonkeyPatch) -> None:
        """With less free on the state dir's file system than the reserve, doctor's store
        finding fails and says to prune; with room, it is ok and says the store's size."""
        found = {f.check: f for f in doctor(two.node, check_systemd=False)}
        assert found["store"].level == "ok" and "2 releases" in found["store"].detail
        real = os.statvfs

        def full(path: object) -> os.statvfs_result:  # 10 GiB, 1 MiB of it free
            st = real(path)  # type: ignore[arg-type]
            return os.statvfs_result((4096, 4096, 10 << 18, 256, 256, *st[5:]))

        monkeypatch.setattr(room.os, "statvfs", full)
        found = {f.check: f for f in doctor(two.node, check_systemd=False)}
        assert found["store"].level == "fail"
        assert "1 MiB free, below the 102.4 MiB the way back keeps" in found["store"].detail
        assert "release prune" in found["store"].fix


class TestPruneFreed:
    def test_a_release_of_its_own_frees_all_its_bytes(self, world: World, tmp_path: Path) -> None:
        """Pruning a release that shares nothing frees what `du` says it takes, and its dry run
        said so before."""
        add(_release(tmp_path / "a", "1.0.0", os.urandom(MIB), MIB), world.node)
        add(_release(tmp_path / "b", "2.0.0", os.urandom(MIB), MIB), world.node)
        world.node.controller.fire("install", release="2.0.0")
        where = world.paths.releases_dir
        own = _du(where / "2.0.0", where / "1.0.0")[1]
        assert own >= 2 * MIB
        assert prune(world.node, dry_run=True).freed_bytes == own
        assert prune(world.node).freed_bytes == own

    def test_a_release_sharing_files_frees_only_the_rest(self, two: World) -> None:
        """Pruning a release whose files a kept release still links frees only its own bytes,
        never the shared ones; the dry run says the same."""
        where = two.paths.releases_dir
        own = _du(where / "2.0.0", where / "1.0.0")[1]
        assert MIB // 2 <= own < MIB
        assert prune(two.node, dry_run=True).freed_bytes == own
        pruned = prune(two.node)
        assert pruned.removed == ("1.0.0",) and pruned.freed_bytes == own

    def test_prune_says_what_it_freed_and_what_it_would(self, two: World) -> None:
        """`release prune --dry-run` ends with what it would free, the prune itself with what it
        freed, and --json has the bytes."""
        freed = json.loads(_prune_cli(two, "--dry-run", "--json").stdout)["freed_bytes"]
        assert freed == prune(two.node, dry_run=True).freed_bytes > MIB // 2
        dry = _prune_cli(two, "--dry-run").stdout.splitlines()
        assert dry[-1] == f"would free {size_text(freed)}", dry
        done = _prune_cli(two).stdout.splitlines()
        assert done[0] == "removed 1.0.0" and done[-1].startswith(f"freed {size_text(freed)}")


def _prune_cli(world: World, *args: str) -> subprocess.CompletedProcess[str]:
    cfg = world.root.parent / "config.toml"
    cfg.write_text('name = "agent"\n[judgment]\ndeadline_seconds = 60\nsoak_seconds = 5\n')
    env = {k: v for k, v in os.environ.items() if k != "AGENT_FSM_CONFIG"}
    done = subprocess.run([sys.executable, "-m", "agent_fsm", "--config", str(cfg), "--root",
                           str(world.root), "release", "prune", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=60, check=True)
    return done
