"""A release's bin/agent-fsm runs no code of the release before its tree is proven root's alone,
and finds the config exactly as agent-fsm does: from the options before the command."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from agent_fsm.actions.releases.packing import pack
from agent_fsm.node.config import launcher_python

pytestmark = [pytest.mark.xdist_group("packed-trust"),  # its module fixture is made once
              pytest.mark.skipif(os.geteuid() != 0, reason="chowns to another user: needs root")]

NOBODY = 65534
HOST_PYTHON = Path(sys.executable).resolve()


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pack("7.0.0", tmp_path_factory.mktemp("trust") / "rel")


def planted(release: Path, marker: Path) -> None:
    """A `json.py` in the release's lib/ that marks when it runs (agent-fsm imports json)."""
    (release / "lib" / "json.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nraise SystemExit('planted json ran')\n")


def launch(release: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/usr/bin/env", "-i", str(release / "bin" / "agent-fsm"),
                           *(args or ("--version",))], capture_output=True, text=True,
                          check=False, timeout=120, cwd=cwd)


def refused(proc: subprocess.CompletedProcess[str], where: Path) -> bool:
    return (proc.returncode == 1 and proc.stderr.count("\n") == 1
            and "refusing to run release" in proc.stderr
            and f": {where} is not root's alone" in proc.stderr)


# What another user may have done to a release tree below /tmp: (what, the path named).
SPOILED: dict[str, Callable[[Path], Path]] = {
    "lib/ writable by others": lambda r: _chmod(r / "lib", 0o777),
    "lib/ group-writable": lambda r: _chmod(r / "lib", 0o775),
    "a lib/ file another user's": lambda r: _chown(r / "lib" / "json.py"),
    "a lib/ directory another user's": lambda r: _chown(r / "lib" / "agent_fsm"),
    "the release dir another user's": lambda r: _chown(r),
    "a parent dir another user's": lambda r: _chown(r.parent),
    "a parent dir writable by others, not sticky": lambda r: _chmod(r.parent, 0o777),
    "bin/agent-fsm writable by others": lambda r: _chmod(r / "bin" / "agent-fsm", 0o757),
    "a link in lib/": lambda r: _link(r / "lib" / "elsewhere.py"),
}


def _chmod(path: Path, mode: int) -> Path:
    path.chmod(mode)
    return path


def _chown(path: Path) -> Path:
    os.chown(path, NOBODY, NOBODY)
    return path


def _link(path: Path) -> Path:
    path.symlink_to("/etc/hostname")
    return path


class TestTree:
    @pytest.mark.parametrize("spoiled", sorted(SPOILED))
    def test_a_tree_another_user_could_change_is_refused(self, packed: Path, tmp_path: Path,
                                                        spoiled: str) -> None:
        """Run as root, a release with a component another user owns or may write refuses in
        one line naming it (exit 1), and the json.py planted in its lib/ never runs."""
        release = tmp_path / "shared" / "rel"
        shutil.copytree(packed, release)
        marker = tmp_path / "planted-ran"
        planted(release, marker)
        where = SPOILED[spoiled](release)
        proc = launch(release, cwd=tmp_path)
        assert refused(proc, where), proc.stderr
        assert not marker.exists()

    def test_a_sticky_directory_of_roots_above_is_trusted(self, packed: Path,
                                                          tmp_path: Path) -> None:
        """Below a root-owned sticky world-writable directory (/tmp, /var/tmp), a release of
        root's own runs: no other user can rename or remove root's entries there."""
        shared = tmp_path / "shared"
        shared.mkdir(mode=0o1777)
        shared.chmod(0o1777)
        release = shared / "rel"
        shutil.copytree(packed, release)
        proc = launch(release, cwd=tmp_path)
        assert proc.returncode == 0 and proc.stdout.startswith("agent-fsm "), proc.stderr

    def test_a_sticky_directory_another_user_owns_is_refused(self, packed: Path,
                                                              tmp_path: Path) -> None:
        """A sticky directory above the release that another user owns is theirs to change."""
        shared = tmp_path / "shared"
        shared.mkdir()
        shared.chmod(0o1777)
        os.chown(shared, NOBODY, NOBODY)
        shutil.copytree(packed, shared / "rel")
        assert refused(launch(shared / "rel", cwd=tmp_path), shared)


class TestBootstrap:
    @pytest.fixture
    def archive(self, packed: Path, tmp_path: Path) -> Path:
        """The release as the guide ships it: `myagent-7.0.0.tar.gz`, made by its build user."""
        def built(info: tarfile.TarInfo) -> tarfile.TarInfo:
            info.uid = info.gid = 1000
            info.uname = info.gname = ""
            return info

        out = tmp_path / "myagent-7.0.0.tar.gz"
        with tarfile.open(out, "w:gz") as tar:
            tar.add(packed, arcname="myagent-7.0.0", filter=built)
        return out

    def test_a_directory_prepared_in_tmp_never_runs_its_code(self, archive: Path,
                                                             tmp_path: Path) -> None:
        """Another user made `myagent-7.0.0/lib/json.py` in a shared /tmp beforehand: root's
        `tar -xzf … -C /tmp` keeps it, and the release's launcher refuses instead of running it."""
        shared = tmp_path / "tmp"
        shared.mkdir()
        shared.chmod(0o1777)
        marker = tmp_path / "planted-ran"
        lib = shared / "myagent-7.0.0" / "lib"
        lib.mkdir(parents=True)
        planted(lib.parent, marker)
        for path in (lib.parent, lib, lib / "json.py"):
            os.chown(path, NOBODY, NOBODY)
        subprocess.run(["tar", "-xzf", str(archive), "-C", str(shared)], check=True, timeout=60)
        proc = launch(lib.parent, cwd=tmp_path)
        assert proc.returncode == 1 and "refusing to run release" in proc.stderr, proc.stderr
        assert not marker.exists()

    def test_the_guides_commands_unpack_a_release_that_runs(self, archive: Path,
                                                            tmp_path: Path) -> None:
        """The guide's bootstrap (`d=$(mktemp -d)`, `tar --no-same-owner`) unpacks into a
        directory only root can write, root's files whatever the archive's owner: it runs."""
        script = (f'set -e\nd=$(mktemp -d -p {tmp_path})\n'
                  f'tar -xzf {archive} -C "$d" --no-same-owner --no-same-permissions\n'
                  '"$d"/myagent-7.0.0/bin/agent-fsm --version\n')
        proc = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=False,
                              timeout=120, env={"PATH": "/usr/bin:/bin"})
        assert proc.returncode == 0 and proc.stdout.startswith("agent-fsm "), proc.stderr


class TestConfigOption:
    def _configs(self, tmp_path: Path) -> tuple[Path, Path]:
        """A config naming a python that marks its use, and where the mark goes."""
        marker = tmp_path / "other-python-ran"
        python = tmp_path / "python"
        python.write_text(f'#!/bin/sh\ntouch {marker}\nexec {HOST_PYTHON} "$@"\n')
        python.chmod(0o755)
        other = tmp_path / "x.toml"
        other.write_text(f'python = "{python}"\n')
        return other, marker

    @pytest.mark.parametrize("args", [
        ("hold", "--reason", "--config={other}"),
        ("hold", "--reason", "--config", "{other}"),
        ("--root", "{tmp}", "hold", "--reason", "--config", "{other}"),
        ("--", "--config", "{other}"),
    ])
    def test_a_config_option_past_the_command_is_a_value(self, packed: Path, tmp_path: Path,
                                                         args: tuple[str, ...]) -> None:
        """`--config` after the command (an option's value, as `hold --reason`'s) never names
        the config the launcher reads its python from: the default one is read."""
        other, marker = self._configs(tmp_path)
        argv = [a.format(other=other, tmp=tmp_path) for a in args]
        launch(packed, *argv, cwd=tmp_path)
        assert not marker.exists()

    @pytest.mark.parametrize("args", [
        ("--config={other}", "--version"),
        ("--root", "{tmp}", "--config", "{other}", "--version"),
    ])
    def test_a_leading_config_option_is_the_one_read(self, packed: Path, tmp_path: Path,
                                                     args: tuple[str, ...]) -> None:
        """`--config FILE` before the command names the config whose python is run."""
        other, marker = self._configs(tmp_path)
        proc = launch(packed, *(a.format(other=other, tmp=tmp_path) for a in args), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert marker.exists()


class TestConfigPython:
    @pytest.mark.parametrize("text", [
        'name = """\npython = "{python}"\n"""\n',
        "name = \'\'\'\npython = \"{python}\"\n\'\'\'\n",
        'x = {{\n python = "{python}"\n}}\n',
        '[judgment]\npython = "{python}"\n',
    ])
    def test_text_that_is_not_the_python_key_is_never_run(self, packed: Path, tmp_path: Path,
                                                          text: str) -> None:
        """A line that reads `python = "…"` but is not the root table's `python` key to TOML
        (inside a multi-line string, an inline table, another table) names no interpreter to
        the launcher, and agent-fsm refuses a file where the two would differ."""
        marker = tmp_path / "other-python-ran"
        python = tmp_path / "python"
        python.write_text(f'#!/bin/sh\ntouch {marker}\nexec {HOST_PYTHON} "$@"\n')
        python.chmod(0o755)
        config = tmp_path / "config.toml"
        config.write_text(text.format(python=python))
        launch(packed, "--config", str(config), "--version", cwd=tmp_path)
        assert not marker.exists()
        assert launcher_python(config.read_text()) is None
