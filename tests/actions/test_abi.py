"""A release records the ABI of the compiled extensions it vendors, and `release add` refuses one
the node's configured `python` cannot load, naming both ABIs."""

from __future__ import annotations

import importlib.machinery
import json
import re
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

from agent_fsm.actions.releases import abi
from agent_fsm.actions.releases.packing import add
from agent_fsm.errors import ConfigError, Refused
from tests.helpers import DEFAULT_CONFIG, World, make_world
from tests.node.test_release_store import make_release

EXT_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")  # e.g. .cpython-311-x86_64-linux-gnu.so
TAG = sys.implementation.cache_tag


def with_extension(tmp_path: Path) -> Path:
    """A small release that vendors one compiled extension module (as pydantic_core does)."""
    release = make_release(tmp_path)
    (release / "lib" / "fast").mkdir(parents=True)
    (release / "lib" / "fast" / f"_speedups{EXT_SUFFIX}").write_bytes(b"\x7fELF")
    abi.record(release)
    return release


def interpreter(tmp_path: Path, *, version: tuple[int, ...] = (3, 12, 1), tag: str = "cpython-312",
                platform: str | None = None) -> Path:
    """A stand-in for the node's python: a script that answers the probe as another
    interpreter would (a process boundary)."""
    suffixes = [f".{tag}-x86_64-linux-gnu.so", ".abi3.so", ".so"]
    answer = json.dumps({"version": list(version), "cache_tag": tag,
                         "platform": platform or sysconfig.get_platform(), "suffixes": suffixes})
    script = tmp_path / "python3"
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{answer}\nEOF\n")
    script.chmod(0o755)
    return script


def node_with(tmp_path: Path, python: Path) -> World:
    return make_world(tmp_path / "root", DEFAULT_CONFIG._replace(python=python))


class TestRecorded:
    def test_compiled_extensions_record_the_packing_interpreters_abi(self,
                                                                     tmp_path: Path) -> None:
        """A release that vendors a compiled extension records Python 3.11, the packing
        interpreter's ABI and that extension."""
        need = tomllib.loads((with_extension(tmp_path) / "python.toml").read_text())
        assert need["requires_python"] == "3.11"
        assert need["cache_tag"] == TAG and need["platform"] == sysconfig.get_platform()
        assert need["extension_suffixes"] == [EXT_SUFFIX]
        assert need["extensions"] == [f"fast/_speedups{EXT_SUFFIX}"]

    def test_no_compiled_extension_records_only_the_python_version(self, tmp_path: Path) -> None:
        """A release of pure Python records only the oldest Python it runs on; a shared library
        that is no extension module of this Python (libfoo.so.1) is not counted."""
        release = make_release(tmp_path)
        (release / "lib" / "pure").mkdir(parents=True)
        (release / "lib" / "pure" / "__init__.py").write_text("")
        (release / "lib" / "pure" / "libfoo.so.1").write_bytes(b"\x7fELF")
        abi.record(release)
        assert tomllib.loads((release / "python.toml").read_text()) == {"requires_python": "3.11"}


class TestAdd:
    def test_the_node_python_of_another_abi_is_refused(self, tmp_path: Path) -> None:
        """The config's python is CPython 3.12: a release vendoring 3.11 extensions is refused
        (exit 3) in one line naming both ABIs and what to do; nothing is stored."""
        world = node_with(tmp_path, interpreter(tmp_path))
        release = with_extension(tmp_path)
        with pytest.raises(Refused) as refused:
            add(release, world.node)
        message = str(refused.value)
        assert refused.value.exit_code == 3 and "\n" not in message
        assert f"built for {TAG} on" in message and "is cpython-312 on" in message
        assert f"fast/_speedups{EXT_SUFFIX}" in message and str(release) in message
        assert "pack the release on a machine whose Python is the node's" in message
        assert world.node.releases.versions() == []

    def test_another_platform_is_refused(self, tmp_path: Path) -> None:
        """Same Python version, another platform: refused."""
        python = interpreter(tmp_path, version=sys.version_info[:3], tag=TAG,
                             platform="linux-aarch64")
        with pytest.raises(Refused, match=r"is .* on linux-aarch64"):
            add(with_extension(tmp_path), node_with(tmp_path, python).node)

    def test_an_older_python_is_refused(self, tmp_path: Path) -> None:
        """A node whose python is 3.10 cannot run a release that needs 3.11: refused."""
        python = interpreter(tmp_path, version=(3, 10, 12), tag="cpython-310")
        release = make_release(tmp_path)
        abi.record(release)
        with pytest.raises(Refused, match=r"needs Python 3\.11 or later, but .* is 3\.10\.12"):
            add(release, node_with(tmp_path, python).node)

    def test_the_real_interpreter_of_the_same_abi_accepts(self, tmp_path: Path) -> None:
        """The real interpreter that recorded the release's ABI lets it be stored."""
        world = node_with(tmp_path, Path(sys.executable))
        assert add(with_extension(tmp_path), world.node).version == "1.0.0"

    @pytest.mark.parametrize("python", ["missing", "prints junk"])
    def test_a_python_that_cannot_say_is_a_clear_error(self, tmp_path: Path, python: str) -> None:
        """A configured python that does not run, or does not answer, is an error naming it."""
        path = tmp_path / "nonexistent" / "python3"
        if python == "prints junk":
            path = tmp_path / "python3"
            path.write_text("#!/bin/sh\necho hello\n")
            path.chmod(0o755)
        with pytest.raises(ConfigError, match=re.escape(f"the config's `python` {path}") +
                           r"( \(run as [^)]*\))?: "):
            add(with_extension(tmp_path), node_with(tmp_path, path).node)

    def test_below_a_root_the_hosts_own_python_is_asked(self, tmp_path: Path) -> None:
        """Under --root (a container driving its host) the config's python is the host's: the
        interpreter at that path below the root answers, not this machine's at the same path."""
        world = node_with(tmp_path, Path(sys.executable))  # this machine's: would accept
        host_python = world.node.paths.real(Path(sys.executable))
        host_python.unlink()
        host_python.symlink_to(interpreter(tmp_path))  # the host's is CPython 3.12
        with pytest.raises(Refused, match=r"is cpython-312 on"):
            add(with_extension(tmp_path), world.node)

    def test_a_release_without_python_toml_is_not_checked(self, tmp_path: Path) -> None:
        """A release made without python.toml (by hand, or packed before it) is stored whatever
        the python."""
        world = node_with(tmp_path, tmp_path / "nonexistent")
        assert add(make_release(tmp_path), world.node).version == "1.0.0"

    def test_probe_reads_the_real_interpreter(self) -> None:
        """Probing the real interpreter gives what it says of itself."""
        from agent_fsm.system.interpreter import probe, running

        found = probe(Path(sys.executable))
        assert found == running()
        assert found.suffixes == tuple(importlib.machinery.EXTENSION_SUFFIXES)
        assert EXT_SUFFIX in found.suffixes
