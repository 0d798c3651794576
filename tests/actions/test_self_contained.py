"""A packed release runs with the node's python3 and its own lib/ alone: no venv, no network."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import agent_fsm
from agent_fsm.actions.releases.packing import pack
from agent_fsm.actions.releases.vendoring import RUNTIME_REQUIREMENTS
from agent_fsm.errors import ConfigError
from agent_fsm.node.config import load
from tests.helpers import World

pytestmark = pytest.mark.xdist_group("packed-self-contained")  # its module fixture is made once (Makefile)

CHECKOUT = Path(agent_fsm.__file__).resolve().parents[1]
NODE_PYTHON = Path("/usr/bin/python3")
needs_node_python = pytest.mark.skipif(not NODE_PYTHON.exists(),
                                       reason="no /usr/bin/python3 on this machine")


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pack("3.1.4", tmp_path_factory.mktemp("packed") / "rel")


def _bare(release: Path, *args: str, cwd: Path, env: dict[str, str] | None = None,
          ) -> subprocess.CompletedProcess[str]:
    """Run the release's launcher with an empty environment (`env -i`): no PATH, no venv."""
    extra = [f"{k}={v}" for k, v in (env or {}).items()]
    return subprocess.run(["/usr/bin/env", "-i", *extra, str(release / "bin" / "agent-fsm"),
                           *args], capture_output=True, text=True, cwd=cwd, check=False,
                          timeout=120)


def _config(path: Path, python: str | None = None) -> Path:
    line = f'python = "{python}"\n' if python else ""
    path.write_text(f'name = "agent"\n{line}[judgment]\ndeadline_seconds = 60\n')
    return path


@needs_node_python
class TestRunsAlone:
    def test_version_under_an_empty_environment(self, release: Path, tmp_path: Path) -> None:
        """`env -i rel/bin/agent-fsm --version` prints the release's version with no PATH and
        no venv anywhere in reach."""
        proc = _bare(release, "--version", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == f"agent-fsm {agent_fsm.__version__} (release 3.1.4)\n"

    def test_status_json_of_a_node_under_an_empty_environment(self, release: Path,
                                                               world: World) -> None:
        """The release's CLI reads a node's state with the node's python3 alone."""
        world.installed("1.0.0")
        cfg = _config(world.root.parent / "config.toml", str(NODE_PYTHON))
        proc = _bare(release, "--config", str(cfg), "--root", str(world.root), "status", "--json",
                     cwd=world.root.parent)
        assert proc.returncode == 0, proc.stderr
        status = json.loads(proc.stdout)
        assert status["selected"] == status["last_good"] == "1.0.0"
        assert status["state"] == "converged"

    def test_the_configs_python_is_the_one_run(self, release: Path, tmp_path: Path) -> None:
        """The launcher runs the interpreter the config names (`--config FILE` or
        `--config=FILE`), and refuses one that is not there, naming it."""
        marker = tmp_path / "used"
        wrapper = tmp_path / "py"
        wrapper.write_text(f'#!/bin/sh\necho "$@" > {marker}\nexec {NODE_PYTHON} "$@"\n')
        wrapper.chmod(0o755)
        cfg = _config(tmp_path / "config.toml", str(wrapper))
        proc = _bare(release, f"--config={cfg}", "--version", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert marker.read_text().startswith(f"-I -S -B {release}/lib/agent-fsm-boot.py ")
        cfg = _config(tmp_path / "config.toml", "/nonexistent/python3")
        proc = _bare(release, "--config", str(cfg), "--version", cwd=tmp_path)
        assert proc.returncode == 1
        assert "/nonexistent/python3" in proc.stderr and "`python`" in proc.stderr
        proc = _bare(release, "--version", cwd=tmp_path,
                     env={"AGENT_FSM_CONFIG": str(_config(tmp_path / "c2.toml", str(wrapper)))})
        assert proc.returncode == 0 and marker.exists()

    def test_the_callers_python_path_is_ignored(self, release: Path, tmp_path: Path) -> None:
        """A PYTHONPATH (or PYTHONHOME) in the caller's environment cannot put other code under
        the release."""
        evil = tmp_path / "evil"
        (evil / "agent_fsm").mkdir(parents=True)
        (evil / "agent_fsm" / "__init__.py").write_text("raise SystemExit('evil agent_fsm')\n")
        (evil / "typer.py").write_text("raise SystemExit('evil typer')\n")
        proc = _bare(release, "--help", cwd=evil,
                     env={"PYTHONPATH": str(evil), "PYTHONSTARTUP": str(evil / "typer.py")})
        assert proc.returncode == 0, proc.stderr
        assert "evil" not in proc.stdout + proc.stderr


class TestContents:
    def test_no_path_of_the_packing_machine_in_the_release(self, release: Path) -> None:
        """No file of a release names the venv, the interpreter's prefix or the checkout it was
        packed from."""
        needles = {str(CHECKOUT), sys.prefix, sys.exec_prefix, str(Path(sys.executable).parent)}
        hits = [(str(p.relative_to(release)), n) for p in release.rglob("*") if p.is_file()
                for n in needles if n.encode() in p.read_bytes()]
        assert hits == []

    def test_dependencies_are_vendored_with_their_metadata(self, release: Path) -> None:
        """lib/ holds each runtime dependency with its dist-info (RECORD, METADATA, licenses),
        no console scripts, no .pth files, and byte code only where the lean path needs it."""
        lib = release / "lib"
        infos = {p.name.split("-")[0].lower() for p in lib.glob("*.dist-info")}
        assert {"filelock", "rich", "transitions", "typer"} <= infos
        for info in lib.glob("*.dist-info"):
            assert (info / "METADATA").is_file() and (info / "RECORD").is_file()
            assert not (info / "direct_url.json").exists()
        assert list(lib.glob("rich-*.dist-info/**/LICENSE*"))
        assert not list(release.rglob("*.pth"))
        compiled = {p.relative_to(lib).parts[0] for p in lib.rglob("*.pyc")}
        assert compiled == {"agent_fsm", "transitions", "filelock", "__pycache__"}  # six's

    def test_the_lean_path_starts_from_byte_code_checked_against_its_source(self, release: Path) -> None:
        """The daemon's, recover's and upgrade's modules ship as checked-hash .pyc that the
        node's Python loads (valid whatever the stored files' times, never for a changed
        source): every .py of agent_fsm has one."""
        node_magic = subprocess.run(
            ["/usr/bin/python3", "-I", "-S", "-c",
             "import importlib.util, sys; sys.stdout.write(importlib.util.MAGIC_NUMBER.hex())"],
            capture_output=True, text=True, check=True, timeout=60).stdout
        tag = sys.implementation.cache_tag
        for source in (release / "lib" / "agent_fsm").rglob("*.py"):
            data = (source.parent / "__pycache__" / f"{source.stem}.{tag}.pyc").read_bytes()
            assert data[:4].hex() == node_magic, f"{source}: byte code for another Python"
            assert int.from_bytes(data[4:8], "little") == 0b11, f"{source}: not checked-hash"

    @needs_node_python
    def test_nothing_the_daemon_imports_is_compiled_at_its_start(self, release: Path) -> None:
        """Every module of lib/ the daemon imports (through the lean path, the writers' lock
        taken) has its byte code there: none is compiled from source at each start."""
        lib = release / "lib"
        code = ("import importlib.util, os, sys\n"
                f"sys.path.insert(0, {str(lib)!r})\n"
                "import agent_fsm.cli.fast_path, agent_fsm.agent.daemon, agent_fsm.wiring\n"
                "import transitions\n"  # as the engine does when it builds the machine
                "from agent_fsm.node.state import lock\n"
                "lock._filelock()\n"
                "print(sorted(n for n, m in list(sys.modules.items())\n"
                f"    if (getattr(m, '__file__', None) or '').startswith({str(lib)!r})\n"
                "    and not os.path.exists(importlib.util.cache_from_source(m.__file__))))\n")
        out = subprocess.run([str(NODE_PYTHON), "-I", "-S", "-B", "-c", code],
                             capture_output=True, text=True, check=True, timeout=60).stdout
        assert out == "[]\n"

    def test_runtime_requirements_are_the_projects_dependencies(self) -> None:
        """What a release vendors starts from pyproject.toml's `dependencies`, no more, no less."""
        project = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["project"]
        names = sorted(d.split(">")[0].split("=")[0].strip() for d in project["dependencies"])
        assert names == sorted(RUNTIME_REQUIREMENTS)


class TestPythonKey:
    def test_default_and_set(self, tmp_path: Path) -> None:
        """`python` defaults to /usr/bin/python3 and takes an absolute path."""
        assert load(_config(tmp_path / "a.toml")).python == Path("/usr/bin/python3")
        assert load(_config(tmp_path / "b.toml", "/opt/py/bin/python3")).python == Path(
            "/opt/py/bin/python3")

    @pytest.mark.parametrize("text", [
        'python = "bin/python3"\n',
        'python = "/usr/bin/python 3"\n',
        'python = "/usr/bin/../bin/python3"\n',
        'python = 3\n',
    ])
    def test_bad_values_are_refused(self, tmp_path: Path, text: str) -> None:
        """A relative, unnormalized or non-string `python` is refused, naming the key."""
        (tmp_path / "c.toml").write_text(text)
        with pytest.raises(ConfigError, match="`python`"):
            load(tmp_path / "c.toml")

    @pytest.mark.parametrize("text", [
        '"python" = "/usr/bin/python3"\n',
        "python = '/usr/bin/python3'\n",
        'publish_command = ["""/bin/true"""]\npython = "/usr/bin/python3"\n',
        'workload = { user = "nobody" }\npython = "/usr/bin/python3"\n',
    ])
    def test_a_python_the_launcher_cannot_read_is_refused(self, tmp_path: Path,
                                                          text: str) -> None:
        """`python` written in a way the launcher's one-line reader would miss is refused."""
        (tmp_path / "d.toml").write_text(text)
        with pytest.raises(ConfigError):
            load(tmp_path / "d.toml")
