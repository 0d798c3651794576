"""A release added on a node whose `python` is not the packer's carries byte code for that python,
held to a record like any byte of the release, so a start does not compile agent-fsm from source."""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent_fsm.actions.releases.packing import add, packed
from agent_fsm.errors import ReleaseError
from agent_fsm.node.config import Config, Judgment
from agent_fsm.node.releases import bytecode, signing
from tests.helpers import World, make_world

pytestmark = pytest.mark.xdist_group("packed-node-bytecode")  # its module fixture is made once

_PROBE = "import sys; print(sys.implementation.cache_tag)"


def _other_python() -> tuple[Path, str] | None:
    """A CPython 3.11+ on this machine whose byte code is not this one's, and its cache tag."""
    names = [f"python3.{minor}" for minor in range(11, 15)]
    found = [*(f"/usr/bin/{n}" for n in names), *(f"/usr/local/bin/{n}" for n in names),
             *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[1-4]*/bin/python3")),
                    reverse=True)]
    for candidate in found:
        try:
            tag = subprocess.run([candidate, "-I", "-S", "-c", _PROBE], capture_output=True,
                                 text=True, timeout=30, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            continue
        if re.fullmatch(r"cpython-31[1-4]", tag) and tag != sys.implementation.cache_tag:
            return Path(candidate), tag
    return None


OTHER = _other_python()
needs_other_python = pytest.mark.skipif(
    OTHER is None, reason="no CPython 3.11-3.14 other than this one's version on this machine")


@pytest.fixture(scope="module")
def packed_release(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    made = packed("2.7.1", tmp_path_factory.mktemp("packed") / "rel")
    return made.path, made.digest


def _node(tmp_path: Path) -> World:
    assert OTHER is not None
    config = Config(name="agent", python=OTHER[0],
                    judgment=Judgment(deadline_seconds=60, soak_seconds=5, max_attempts=3))
    return make_world(tmp_path / "root", config)


def _compiled_from_source(python: Path, lib: Path) -> list[str]:
    """The modules of `lib` that `python`, run as the launcher runs it, compiles from source
    for `agent-fsm --version`."""
    out = subprocess.run([str(python), "-I", "-S", "-B", "-v", str(lib / "agent-fsm-boot.py"),
                          "--version"], capture_output=True, text=True, timeout=120, check=True)
    prefix = f"# code object from {lib}/"
    return sorted(line[len(prefix):] for line in out.stderr.splitlines()
                  if line.startswith(prefix) and line.endswith(".py"))


@needs_other_python
class TestNodeByteCode:
    def test_the_nodes_python_starts_the_stored_release_from_byte_code(
            self, packed_release: tuple[Path, str], tmp_path: Path) -> None:
        """After `release add`, the node's python (another version than the packer's) loads every
        agent_fsm module it needs from byte code, which it compiles from source as packed."""
        assert OTHER is not None
        release, _ = packed_release
        before = _compiled_from_source(OTHER[0], release / "lib")
        assert any(m.startswith("agent_fsm/") for m in before), before  # the release as packed
        world = _node(tmp_path)
        stored = add(release, world.node).path
        after = _compiled_from_source(OTHER[0], stored / "lib")
        assert [m for m in after if m.startswith(("agent_fsm/", "transitions/", "filelock/"))] \
            == []

    def test_the_release_digest_is_the_packs(self, packed_release: tuple[Path, str],
                                             tmp_path: Path) -> None:
        """The byte code added on the node leaves the release's digest as packed (what a channel's
        index and a signature name) and is recorded beside it."""
        assert OTHER is not None
        release, digest = packed_release
        world = _node(tmp_path)
        added = add(release, world.node)
        assert added.digest == digest
        assert world.node.releases.integrity("2.7.1").digest == digest
        assert signing.message(added.path, stored=True).decode() == digest  # what a signature signs
        extra = bytecode.recorded(world.paths.releases_dir, "2.7.1").decode()
        assert f"lib/agent_fsm/__pycache__/wiring.{OTHER[1]}.pyc" in extra

    def test_a_changed_byte_code_file_is_caught_before_use(
            self, packed_release: tuple[Path, str], tmp_path: Path) -> None:
        """One byte of the node's byte code changed (size and times kept) makes the release refused
        as damaged, naming that file, as a changed source would."""
        assert OTHER is not None
        release, _ = packed_release
        world = _node(tmp_path)
        stored = add(release, world.node).path
        pyc = stored / "lib" / "agent_fsm" / "__pycache__" / f"wiring.{OTHER[1]}.pyc"
        before = pyc.stat()
        data = bytearray(pyc.read_bytes())
        data[-1] ^= 0x01
        pyc.write_bytes(bytes(data))
        os.utime(pyc, ns=(before.st_atime_ns, before.st_mtime_ns))
        with pytest.raises(ReleaseError, match=re.escape(
                f"lib/agent_fsm/__pycache__/wiring.{OTHER[1]}.pyc changed content")):
            world.node.releases.reread("2.7.1")

    def test_a_removed_byte_code_file_is_caught(self, packed_release: tuple[Path, str],
                                                tmp_path: Path) -> None:
        """The node's byte code is held to its record both ways: a file of it removed is damage."""
        assert OTHER is not None
        release, _ = packed_release
        world = _node(tmp_path)
        stored = add(release, world.node).path
        (stored / "lib" / "agent_fsm" / "__pycache__" / f"wiring.{OTHER[1]}.pyc").unlink()
        with pytest.raises(ReleaseError, match=re.escape(
                f"lib/agent_fsm/__pycache__/wiring.{OTHER[1]}.pyc removed")):
            world.node.releases.verify("2.7.1")

    def test_the_way_back_mends_a_release_with_node_byte_code(
            self, packed_release: tuple[Path, str], tmp_path: Path) -> None:
        """A stored release with a source replaced and its node byte code damaged is mended: the
        source comes back from the store's intact copy, the node's byte code is removed, and the
        release verifies again (it runs from its sources)."""
        assert OTHER is not None
        release, _ = packed_release
        world = _node(tmp_path)
        stored = add(release, world.node).path
        source = stored / "lib" / "agent_fsm" / "wiring.py"
        replacement = source.with_name("wiring.new")
        replacement.write_text("raise SystemExit('damaged')\n")
        replacement.chmod(0o644)
        replacement.replace(source)
        pyc = stored / "lib" / "agent_fsm" / "__pycache__" / f"wiring.{OTHER[1]}.pyc"
        pyc.write_bytes(b"damaged")
        fixed = world.node.releases.mend("2.7.1")
        assert [rel for rel, _ in fixed] == ["lib/agent_fsm/wiring.py"]
        assert not pyc.exists()
        assert bytecode.recorded(world.paths.releases_dir, "2.7.1") == b""
        world.node.releases.reread("2.7.1")
