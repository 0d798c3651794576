"""`make dist` builds what a user installs on a build machine (README, "Set-up"): a wheel that,
installed into a fresh venv, gives an `agent-fsm` whose `--help` runs and that packs a release.

The one stand-in: the wheel's dependencies, which pipx or pip would fetch from the index, are
this venv's, seen from the fresh venv through a `.pth` file as `--system-site-packages` shows a
system's; agent-fsm itself comes from the wheel alone (no index, no network, not the checkout).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import agent_fsm

ROOT = Path(__file__).resolve().parents[2]
VERSION = agent_fsm.__version__
WHEEL = f"agent_fsm-{VERSION}-py3-none-any.whl"
SDIST = f"agent_fsm-{VERSION}.tar.gz"

pytestmark = [
    pytest.mark.xdist_group("make-dist"),  # its module fixture is made once (Makefile)
    pytest.mark.timeout(180),
    pytest.mark.skipif(shutil.which("make") is None, reason="runs `make dist` (needs make)"),
]


@dataclass(frozen=True)
class Installed:
    dist: Path
    venv: Path
    work: Path


def _run(argv: list[str | Path], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    # A parent make's jobserver and flags are not this make's; no PYTHONPATH reaches the venv.
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PYTHONPATH")}
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """`make dist` into a directory of the test's that holds an older build, then its wheel
    installed with pip into a new venv."""
    top = tmp_path_factory.mktemp("dist")
    dist, venv, work = top / "dist", top / "venv", top / "work"
    dist.mkdir()
    work.mkdir()
    (dist / "agent_fsm-0.0.1-py3-none-any.whl").write_bytes(b"an older build")
    made = _run(["make", "--no-print-directory", "-C", ROOT, "dist", f"VENV={sys.prefix}",
                 f"PY={sys.executable}", f"DIST={dist}"], cwd=work)
    assert made.returncode == 0, made.stdout + made.stderr
    new = _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=work)
    assert new.returncode == 0, new.stderr
    pip = _run([sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "-q",
                "--no-index", "--no-deps", "--no-cache-dir", dist / WHEEL], cwd=work)
    assert pip.returncode == 0, pip.stderr
    site = _run([venv / "bin" / "python", "-c",
                 "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=work)
    Path(site.stdout.strip(), "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    yield Installed(dist, venv, work)


class TestMakeDist:
    def test_one_wheel_and_one_sdist_of_this_version(self, installed: Installed) -> None:
        """`make dist` leaves exactly this version's wheel and sdist, an older build removed."""
        assert sorted(p.name for p in installed.dist.iterdir()) == [WHEEL, SDIST]

    def test_the_installed_wheels_help_runs(self, installed: Installed) -> None:
        """The venv's `agent-fsm --help` lists the commands, `--version` names this version,
        `diagram` draws the machine from the definition the wheel carries, and agent-fsm is
        imported from the venv, not from the checkout."""
        agent = installed.venv / "bin" / "agent-fsm"
        helped = _run([agent, "--help"], cwd=installed.work)
        assert helped.returncode == 0 and helped.stderr == "", helped.stderr
        assert "release" in helped.stdout and "upgrade" in helped.stdout
        version = _run([agent, "--version"], cwd=installed.work)
        assert (version.returncode, version.stdout) == (0, f"agent-fsm {VERSION}\n"), version.stderr
        drawn = _run([agent, "diagram"], cwd=installed.work)
        assert drawn.returncode == 0, drawn.stderr
        assert drawn.stdout.startswith("stateDiagram-v2\n") and "idle --> converged" in drawn.stdout
        where = _run([installed.venv / "bin" / "python", "-c",
                      "import agent_fsm; print(agent_fsm.__file__)"], cwd=installed.work)
        assert Path(where.stdout.strip()).is_relative_to(installed.venv), where.stdout

    def test_the_installed_wheel_packs_a_release_that_runs(self, installed: Installed) -> None:
        """The build machine's job: the venv's `agent-fsm release pack` makes a release whose
        own launcher runs (with the venv's interpreter as the config's `python`)."""
        release = installed.work / "rel"
        packed = _run([installed.venv / "bin" / "agent-fsm", "release", "pack", "--version",
                       "1.0.0", "--output", release], cwd=installed.work)
        assert packed.returncode == 0, packed.stderr
        config = installed.work / "config.toml"
        config.write_text(f'name = "agent"\npython = "{installed.venv / "bin" / "python"}"\n')
        ran = _run([release / "bin" / "agent-fsm", "--config", config, "--version"],
                   cwd=installed.work)
        assert (ran.returncode, ran.stdout) == (0, f"agent-fsm {VERSION} (release 1.0.0)\n"), (
            ran.stderr)
