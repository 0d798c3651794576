"""One release for the fleet: `release pack` says which node interpreters a release covers and
fails when it cannot cover those asked; the launcher serves only those, refusing any other in one
line (no traceback); a broken `python` in the live config falls back to the last-good's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from agent_fsm.actions.releases import abi
from agent_fsm.actions.releases.packing import add, pack
from agent_fsm.actions.releases.vendoring import BOOT_FILE, KEPT_PYTHON, boot
from agent_fsm.errors import ReleaseError
from agent_fsm.node.assets import kept
from agent_fsm.node.assets.kept import KeptAssets
from agent_fsm.node.config import Config, WorkloadConfig
from agent_fsm.node.paths import Paths
from tests.actions.test_abi import interpreter, node_with, with_extension

pytestmark = pytest.mark.xdist_group("packed-targets")  # its module fixture is made once (Makefile)

HOST_PYTHON = Path(sys.executable).resolve()
MACHINE = os.uname().machine
HERE = f"cp3{sys.version_info[1]}-{MACHINE}"


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pack("6.0.0", tmp_path_factory.mktemp("targets") / "rel")


def stand_in(tmp_path: Path, *, machine: str | None = None,
             version: tuple[int, int, int] | None = None) -> Path:
    """A node interpreter as the launcher sees it: this Python, answering as one of another
    machine (`os.uname()`) or version (`sys.version_info`): a process boundary."""
    fakes = []
    if machine is not None:
        fakes.append(f"os.uname = lambda: ('Linux', 'node', 'r', 'v', {machine!r})")
    if version is not None:
        fakes.append(f"sys.version_info = {version!r}; sys.version = {'.'.join(map(str, version))!r}")
    # The launcher runs `python -I -S -B LIB/agent-fsm-boot.py ARGS...`: run it after the fakes.
    name = f"python-{machine or 'here'}-{'.'.join(map(str, version or ()))}"
    prelude = tmp_path / f"{name}.py"
    prelude.write_text("import os, sys\n" + "\n".join(fakes) + "\nboot = sys.argv.pop(1)\n"
                       "exec(compile(open(boot).read(), boot, 'exec'), {'__file__': boot})\n")
    script = tmp_path / name
    script.write_text(f'#!/bin/sh\nshift 3\nexec {HOST_PYTHON} -I -S -B {prelude} "$@"\n')
    script.chmod(0o755)
    return script


def covering(packed: Path, tmp_path: Path, targets: tuple[str, ...]) -> Path:
    """A copy of the packed release whose launcher covers `targets` only."""
    release = tmp_path / "rel"
    shutil.copytree(packed, release, symlinks=True)
    (release / "lib" / BOOT_FILE).write_text(boot("6.0.0", targets))
    return release


def run(release: Path, python: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "config.toml"
    config.write_text(f'name = "agent"\npython = "{python}"\n')
    return subprocess.run(["/usr/bin/env", "-i", str(release / "bin" / "agent-fsm"),
                           "--config", str(config), *(args or ("--version",))],
                          capture_output=True, text=True, check=False, timeout=120, cwd=tmp_path)


class TestPack:
    def test_a_pure_release_covers_every_cpython_of_the_fleet(self, packed: Path) -> None:
        """With agent-fsm's own dependencies, a release holds no compiled code and covers any
        CPython 3.11+ on any platform: its python.toml lists no extension."""
        assert tomllib.loads((packed / "python.toml").read_text()) == {"requires_python": "3.11"}
        need = abi.read(packed)
        assert need is not None and need.targets == (abi.ANY,)
        assert not list((packed / "lib").rglob("*.so"))
        assert not (packed / "lib" / "pydantic_core").exists()

    def test_python_toml_holds_only_keys_an_older_agent_fsm_reads(self, packed: Path,
                                                                   tmp_path: Path) -> None:
        """An agent-fsm from before targets (which refuses unknown keys) can add what this one
        packs, pure or compiled: python.toml holds only the keys it knew."""
        known = {"requires_python", "cache_tag", "platform", "extension_suffixes", "extensions"}
        for release in (packed, with_extension(tmp_path)):
            assert set(tomllib.loads((release / "python.toml").read_text())) <= known

    def test_compiled_extensions_cannot_be_packed_for_the_fleet(self, tmp_path: Path) -> None:
        """A lib/ with an extension built for this interpreter cannot cover the fleet: one
        line naming the targets it misses, the extension and both ways out."""
        need = abi.needs(with_extension(tmp_path) / "lib")
        assert need.targets == (HERE,)
        with pytest.raises(ReleaseError) as failed:
            abi.uncovered(need, abi.FLEET)
        message = str(failed.value)
        assert "\n" not in message and "cp314-aarch64" in message and f"{HERE}," not in message
        assert "fast/_speedups" in message and "typer<0.29" in message
        assert f"--target {HERE}" in message
        abi.uncovered(need, (HERE,))  # asked only for its own: covered

    def test_a_target_not_written_as_one_is_refused(self, tmp_path: Path) -> None:
        """`--target 3.13` is not a target: refused before anything is written."""
        with pytest.raises(ReleaseError, match=r"'3\.13' is not a target.*cp311-x86_64"):
            pack("6.0.1", tmp_path / "rel", targets=("3.13",))
        assert not (tmp_path / "rel").exists()


class TestAdd:
    @pytest.mark.parametrize("tag", ["cpython-311", "cpython-313", "cpython-314"])
    def test_a_pure_release_is_added_for_any_node_python_of_the_fleet(
            self, packed: Path, tmp_path: Path, tag: str) -> None:
        """A node whose python is CPython 3.13 on aarch64 (or 3.11, 3.14) takes the release."""
        version = (3, int(tag[-2:]), 0)
        python = interpreter(tmp_path, version=version, tag=tag, platform="linux-aarch64")
        world = node_with(tmp_path, python)
        assert add(packed, world.node).version == "6.0.0"

    def test_a_node_outside_a_compiled_release_is_refused(self, tmp_path: Path) -> None:
        """A release covering cp3X-x86_64 only is refused on an aarch64 node, in one line."""
        python = interpreter(tmp_path, version=sys.version_info[:3],
                             tag=sys.implementation.cache_tag, platform="linux-aarch64")
        with pytest.raises(Exception, match=r"on linux-aarch64") as refused:
            add(with_extension(tmp_path), node_with(tmp_path, python).node)
        assert "\n" not in str(refused.value)


class TestLauncher:
    def test_serves_an_interpreter_of_a_covered_target(self, packed: Path, tmp_path: Path) -> None:
        """A pure release runs on this Python, and on one answering as aarch64."""
        for python in (HOST_PYTHON, stand_in(tmp_path, machine="aarch64")):
            proc = run(packed, python, tmp_path)
            assert proc.returncode == 0 and proc.stdout.startswith("agent-fsm "), proc.stderr

    def test_the_command_line_ps_shows_is_short(self, packed: Path, tmp_path: Path) -> None:
        """What `ps` and `systemctl status` show of a release's agent-fsm is the interpreter,
        its flags, the release's boot file and the arguments: one short line, no program."""
        seen = tmp_path / "argv"
        python = tmp_path / "python-recording"
        python.write_text(f'#!/bin/sh\nprintf "%s\\0" "$@" > {seen}\nexec {HOST_PYTHON} "$@"\n')
        python.chmod(0o755)
        proc = run(packed, python, tmp_path, "--version")
        assert proc.returncode == 0 and proc.stdout.startswith("agent-fsm "), proc.stderr
        argv = seen.read_bytes().split(b"\0")[:-1]
        config = str(tmp_path / "config.toml").encode()
        assert argv == [b"-I", b"-S", b"-B", str(packed / "lib" / BOOT_FILE).encode(),
                        b"--config", config, b"--version"]

    def test_chooses_by_machine(self, packed: Path, tmp_path: Path) -> None:
        """A release covering cp3X-aarch64 only runs on an aarch64 interpreter of that version
        and refuses this machine's in one line naming its target and what the release covers."""
        mine = f"cp3{sys.version_info[1]}"
        release = covering(packed, tmp_path, (f"{mine}-aarch64",))
        served = run(release, stand_in(tmp_path, machine="aarch64"), tmp_path)
        assert served.returncode == 0, served.stderr
        if MACHINE != "aarch64":
            refused = run(release, HOST_PYTHON, tmp_path)
            assert refused.returncode == 1 and refused.stdout == ""
            assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
            assert f"is {mine}-{MACHINE}; release 6.0.0 covers {mine}-aarch64 only" \
                in refused.stderr
        other = run(release, stand_in(tmp_path, machine="x86_64" if MACHINE == "aarch64"
                                      else "ppc64le"), tmp_path)
        assert other.returncode == 1 and "Traceback" not in other.stderr

    def test_a_python_of_another_version_is_refused_in_one_line(self, packed: Path,
                                                                tmp_path: Path) -> None:
        """A release packed here with compiled code for this version only refuses CPython 3.14
        in one line, never with the ImportError a wrong-ABI extension raises."""
        release = covering(packed, tmp_path, (HERE,))
        proc = run(release, stand_in(tmp_path, version=(3, 14, 0)), tmp_path)
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
        assert f"is cp314-{MACHINE}; release 6.0.0 covers {HERE} only" in proc.stderr

    @pytest.mark.parametrize("version", [(3, 9, 18), (3, 10, 12)])
    def test_python_3_9_and_3_10_are_refused_in_one_line(self, packed: Path, tmp_path: Path,
                                                         version: tuple[int, int, int]) -> None:
        """RHEL 9's 3.9 and Ubuntu 22.04's 3.10 get one line saying 3.11 is needed."""
        proc = run(packed, stand_in(tmp_path, version=version), tmp_path)
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
        assert f"is Python {'.'.join(map(str, version))}; a release needs 3.11 or later" \
            in proc.stderr


class TestKeptPython:
    def _stored(self, packed: Path, tmp_path: Path) -> Path:
        """The release as a store holds it: `<state_dir>/releases/6.0.0`, the state dir 0700."""
        release = tmp_path / "state" / "releases" / "6.0.0"
        shutil.copytree(packed, release, symlinks=True)
        (tmp_path / "state").chmod(0o700)
        return release

    def _keep(self, tmp_path: Path, python: Path, **workload: object) -> Path:
        """Keep `python` (and `workload`'s settings) as the node keeps the settings it read."""
        config = Config(state_dir=tmp_path / "state", python=python,
                        workload=WorkloadConfig(**workload))  # type: ignore[arg-type]
        copy = KeptAssets("5.0.0", {}, {})
        assert kept.refresh(Paths(config), copy)
        return tmp_path / "state" / KEPT_PYTHON

    def test_a_broken_python_falls_back_to_the_last_goods(self, packed: Path,
                                                          tmp_path: Path) -> None:
        """The live config names a python that is not there: the launcher runs the one kept
        with the settings the node last read valid, and says so on stderr."""
        release = self._stored(packed, tmp_path)
        where = self._keep(tmp_path, HOST_PYTHON)
        proc = run(release, Path("/nonexistent/python3"), tmp_path)
        assert proc.returncode == 0 and proc.stdout.startswith("agent-fsm "), proc.stderr
        assert f"running {HOST_PYTHON}, the `python` kept with the last-good's settings in " \
            f"{where}" in proc.stderr

    def test_a_kept_python_with_non_ascii_characters_is_run(self, packed: Path,
                                                            tmp_path: Path) -> None:
        """A kept python whose path has non-ASCII characters (`/opt/pythön`) is the one the
        launcher runs when the live config's is broken."""
        release = self._stored(packed, tmp_path)
        python = tmp_path / "pythön" / "python3"
        python.parent.mkdir()
        python.symlink_to(HOST_PYTHON)
        self._keep(tmp_path, python)
        proc = run(release, Path("/nonexistent/python3"), tmp_path)
        assert proc.returncode == 0 and proc.stdout.startswith("agent-fsm "), proc.stderr
        assert f"running {python}, the `python` kept with the last-good's settings in" in proc.stderr

    def test_the_workloads_variable_named_python_is_never_run(self, packed: Path,
                                                              tmp_path: Path) -> None:
        """Kept settings whose `[workload] environment` has a `python` variable: with the live
        config's python broken, the launcher runs the kept `python`, never that variable."""
        release = self._stored(packed, tmp_path)
        marker = tmp_path / "evil-ran"
        evil = tmp_path / "evil"
        evil.write_text(f"#!/bin/sh\ntouch {marker}\nexec {HOST_PYTHON} \"$@\"\n")
        evil.chmod(0o755)
        self._keep(tmp_path, HOST_PYTHON, environment=(("python", str(evil)),))
        assert f'"python":"{evil}"' in (tmp_path / "state" / "last-good-assets.json").read_text()
        proc = run(release, Path("/nonexistent/python3"), tmp_path)
        assert proc.returncode == 0 and proc.stdout.startswith("agent-fsm "), proc.stderr
        assert f"running {HOST_PYTHON}, the `python` kept with the last-good's settings in" in proc.stderr
        assert not marker.exists()

    def test_without_a_kept_python_the_error_stays(self, packed: Path, tmp_path: Path) -> None:
        """No kept settings (or their python gone too): one line naming the config's python."""
        release = self._stored(packed, tmp_path)
        proc = run(release, Path("/nonexistent/python3"), tmp_path)
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1
        assert "/nonexistent/python3 (the config's `python`) is not executable" in proc.stderr

    def test_outside_a_closed_store_no_kept_python_is_read(self, packed: Path,
                                                           tmp_path: Path) -> None:
        """A release beside a kept python, in a state dir others may enter, never falls back."""
        release = self._stored(packed, tmp_path)
        self._keep(tmp_path, HOST_PYTHON)
        (tmp_path / "state").chmod(0o755)
        proc = run(release, Path("/nonexistent/python3"), tmp_path)
        assert proc.returncode == 1 and "is not executable" in proc.stderr, proc.stderr

    @pytest.mark.parametrize("mode", [0o664, 0o646])
    def test_a_kept_file_others_can_write_is_not_trusted(self, packed: Path, tmp_path: Path,
                                                         mode: int) -> None:
        """A kept python writable by group or others never chooses the interpreter."""
        release = self._stored(packed, tmp_path)
        self._keep(tmp_path, HOST_PYTHON).chmod(mode)
        proc = run(release, Path("/nonexistent/python3"), tmp_path)
        assert proc.returncode == 1 and "is not executable" in proc.stderr, proc.stderr


class TestCli:
    def test_pack_says_what_it_covers_and_list_shows_it(self, tmp_path: Path) -> None:
        """`release pack --target …` prints what the release covers; once added, `release list`
        shows it under the release and as `covers` in --json."""
        root, cfg = tmp_path / "root", tmp_path / "config.toml"
        (root / "usr" / "bin").mkdir(parents=True)
        (root / "usr" / "bin" / "python3").symlink_to(HOST_PYTHON)  # the node's python
        cfg.write_text('name = "agent"\n[judgment]\ndeadline_seconds = 60\n')

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "agent_fsm", "--config", str(cfg),
                                   "--root", str(root), *args], capture_output=True, text=True,
                                  check=False, timeout=120, env={**os.environ, "COLUMNS": "300"})

        packed = cli("release", "pack", "--version", "6.1.0", "--output", str(tmp_path / "rel"),
                     "--target", "cp313-aarch64", "--target", "cp314-x86_64")
        assert packed.returncode == 0, packed.stderr
        assert packed.stdout.strip().endswith(
            "it covers CPython 3.11+ on any platform (pure Python)")
        added = cli("release", "add", str(tmp_path / "rel"))
        assert added.returncode == 0, added.stderr
        listed = cli("release", "list").stdout.splitlines()
        assert listed[1] == "  covers CPython 3.11+ on any platform (pure Python)", listed
        assert json.loads(cli("release", "list", "--json").stdout)[0]["covers"] == ["any"]

    def test_pack_for_a_target_that_is_none_is_one_line(self, tmp_path: Path) -> None:
        """`release pack --target 3.13`: exit 1, one line naming the value and the form."""
        proc = subprocess.run([sys.executable, "-m", "agent_fsm", "release", "pack", "--version",
                               "6.1.0", "--output", str(tmp_path / "rel"), "--target", "3.13"],
                              capture_output=True, text=True, check=False, timeout=120)
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
        assert "'3.13' is not a target" in proc.stderr and not (tmp_path / "rel").exists()
