"""The cache of `lib/` between packs (`libcache`): a pack served from it makes the release a
pack without it makes, and never carries a stale or damaged copy."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from agent_fsm.actions.releases import libcache, packing
from agent_fsm.actions.releases.trust import digest
from agent_fsm.actions.releases.vendoring import BOOT_FILE


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache of this test's own, and a copy of the package to pack from (so it can change)."""
    monkeypatch.setenv(libcache.ENV, str(tmp_path / "cache"))
    package = tmp_path / "src" / "agent_fsm"
    shutil.copytree(packing.PACKAGE_DIR, package, ignore=packing._ignore)
    monkeypatch.setattr(packing, "PACKAGE_DIR", package)
    return tmp_path / "cache"


def entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("lib-*"))


def test_a_pack_served_from_the_cache_is_the_release_a_fresh_pack_makes(
        cache: Path, tmp_path: Path) -> None:
    """A second pack of the same sources is served from the cache, and its release has the
    same digest as the first (made without it)."""
    first = packing.pack("1.0.0", tmp_path / "a")
    assert len(entries(cache)) == 1
    second = packing.packed("1.0.0", tmp_path / "b")
    assert second.digest == digest(second.path) == digest(first)
    assert len(entries(cache)) == 1


def test_a_changed_source_file_is_packed_not_the_cached_one(cache: Path, tmp_path: Path) -> None:
    """After a source file of the package changes, the next pack carries the new file (a new
    entry), not the one cached before."""
    packing.pack("1.0.0", tmp_path / "a")
    source = packing.PACKAGE_DIR / "errors.py"
    source.write_text(source.read_text() + "\nCHANGED = True\n")
    release = packing.pack("1.0.0", tmp_path / "b")
    assert (release / "lib" / "agent_fsm" / "errors.py").read_text().endswith("CHANGED = True\n")
    assert len(entries(cache)) == 2


def test_a_damaged_cache_entry_is_made_again_not_packed(cache: Path, tmp_path: Path) -> None:
    """A byte changed in a cached file (its size and times kept) is not packed: the release
    is the one a fresh pack made, and the entry is made again."""
    first = packing.packed("1.0.0", tmp_path / "a").digest
    (cached,) = entries(cache)
    victim = cached / "lib" / "agent_fsm" / "errors.py"
    was, st = victim.read_bytes(), victim.stat()
    with victim.open("r+b") as f:
        f.write(bytes([was[0] ^ 1]))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    second = packing.packed("1.0.0", tmp_path / "b")
    assert second.digest == digest(second.path) == first
    assert (cache / cached.name / "lib" / "agent_fsm" / "errors.py").read_bytes() == was


def test_a_pack_from_the_cache_leaves_a_release_packed_before_as_it_was(
        cache: Path, tmp_path: Path) -> None:
    """Packing another version from the same entry (with its own boot file) changes no byte of
    a release packed before."""
    first = packing.packed("1.0.0", tmp_path / "a")
    boot = (first.path / "lib" / BOOT_FILE).read_bytes()
    packing.pack("2.0.0", tmp_path / "b")
    assert (first.path / "lib" / BOOT_FILE).read_bytes() == boot
    assert digest(first.path) == first.digest


def test_a_file_edited_in_a_packed_release_changes_no_other_release_nor_the_cache(
        cache: Path, tmp_path: Path) -> None:
    """A module of one packed release's `lib/` edited in place (as a user patching a pack
    would) leaves another release packed from the same entry, and the entry, as they were."""
    first = packing.packed("1.0.0", tmp_path / "a")
    second = packing.packed("2.0.0", tmp_path / "b")
    (cached,) = entries(cache)
    kept = (cached / "lib" / "agent_fsm" / "errors.py").read_bytes()
    with (second.path / "lib" / "agent_fsm" / "errors.py").open("ab") as f:
        f.write(b"\nEDITED = True\n")
    assert digest(first.path) == first.digest
    assert (cached / "lib" / "agent_fsm" / "errors.py").read_bytes() == kept
