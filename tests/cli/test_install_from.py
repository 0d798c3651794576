"""`agent-fsm install --from`: store a release and install it in one command, from the
release's own launcher on an empty node (real processes, a stub systemctl, a temporary root)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_fsm.actions.releases.packing import pack
from tests.helpers import env_with_stub_systemctl

pytestmark = pytest.mark.xdist_group("packed-install-from")  # its module fixture is made once (Makefile)

ROOT = Path(__file__).resolve().parents[2]


class Node:
    """An empty node below `root`: its config, its python, a systemctl that succeeds."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.root = tmp / "root"
        (self.root / "usr" / "bin").mkdir(parents=True)
        (self.root / "usr" / "bin" / "python3").symlink_to("/usr/bin/python3")
        self.config = tmp / "config.toml"
        self.config.write_text('name = "agent"\n[judgment]\ndeadline_seconds = 60\n')
        self.env = env_with_stub_systemctl(tmp)
        self.env.pop("AGENT_FSM_CONFIG", None)
        self.env["COLUMNS"] = "200"

    def run(self, *args: str, launcher: Path | None = None) -> subprocess.CompletedProcess[str]:
        """agent-fsm as an operator runs it: this checkout's, or a release's own launcher."""
        head = [str(launcher)] if launcher else [sys.executable, "-m", "agent_fsm"]
        env = self.env if launcher else {**self.env, "PYTHONPATH": str(ROOT)}
        return subprocess.run([*head, "--config", str(self.config), "--root", str(self.root),
                               *args], capture_output=True, text=True, env=env, cwd=self.tmp,
                              timeout=120, check=False)

    def status(self) -> dict[str, object]:
        proc = self.run("status", "--json")
        assert proc.returncode == 0, proc.stderr
        data: dict[str, object] = json.loads(proc.stdout)
        return data


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    where = tmp_path_factory.mktemp("packed")
    return {v: pack(v, where / f"agent-fsm-{v}") for v in ("1.0.0", "2.0.0")}


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


class TestInstallFrom:
    def test_the_bootstrap_from_an_empty_node(self, tmp_path: Path,
                                              releases: dict[str, Path]) -> None:
        """The release's own launcher stores and installs itself in one command, and
        `agent-fsm` on PATH then runs the installed release."""
        node = Node(tmp_path)
        release = releases["1.0.0"]
        proc = node.run("install", "--from", str(release), launcher=release / "bin" / "agent-fsm")
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == ""
        said = " ".join(proc.stdout.split())
        assert "release 1.0.0 stored at" in said
        assert "installed 1.0.0: all assets written" in said
        status = node.status()
        assert status["selected"] == status["last_good"] == "1.0.0"
        link = node.root / "usr" / "local" / "bin" / "agent-fsm"
        assert f"agent-fsm on PATH: {link}" in said
        target = node.root / os.readlink(link).lstrip("/")
        version = subprocess.run([str(target), "--version"], capture_output=True, text=True,
                                 env=node.env, timeout=60, check=False)
        assert version.stdout.strip().endswith("(release 1.0.0)"), version.stderr

    def test_version_given_must_match(self, tmp_path: Path, releases: dict[str, Path]) -> None:
        """--version that is not the release's own: one line, exit 1, nothing installed."""
        node = Node(tmp_path)
        proc = node.run("install", "--from", str(releases["1.0.0"]), "--version", "2.0.0")
        assert proc.returncode == 1
        assert "is release 1.0.0, not --version 2.0.0: nothing was installed" in one_line(proc)
        assert node.status()["selected"] is None

    def test_a_version_stored_with_other_content_is_refused(
            self, tmp_path: Path, releases: dict[str, Path]) -> None:
        """--from a directory whose version is stored with other content is refused (exit 3,
        both digests named) and the stored copy is not installed in its place."""
        node = Node(tmp_path)
        assert node.run("release", "add", str(releases["1.0.0"])).returncode == 0
        changed = tmp_path / "changed-1.0.0"
        subprocess.run(["cp", "-a", str(releases["1.0.0"]), str(changed)], check=True)
        (changed / "assets" / "recovery.sh").write_text("#!/bin/sh\nexit 1\n")
        proc = node.run("install", "--from", str(changed))
        assert proc.returncode == 3, proc.stdout + proc.stderr
        assert "sha256:" in one_line(proc)
        assert node.status()["selected"] is None

    def test_version_alone_still_installs_a_stored_release(
            self, tmp_path: Path, releases: dict[str, Path]) -> None:
        """Without --from, --version names a stored release, as before; neither is exit 2."""
        node = Node(tmp_path)
        assert node.run("release", "add", str(releases["2.0.0"])).returncode == 0
        proc = node.run("install", "--version", "2.0.0", "--no-start")
        assert proc.returncode == 0, proc.stderr
        assert node.status()["selected"] == "2.0.0"
        assert node.run("install").returncode == 2

    def test_from_an_archive(self, tmp_path: Path, releases: dict[str, Path]) -> None:
        """--from a .tar.gz of a release stores and installs it, as `release add` takes one."""
        node = Node(tmp_path)
        archive = tmp_path / "agent-fsm-2.0.0.tar.gz"
        subprocess.run(["tar", "-czf", str(archive), "-C", str(releases["2.0.0"].parent),
                        releases["2.0.0"].name], check=True)
        proc = node.run("install", "--from", str(archive), "--no-start")
        assert proc.returncode == 0, proc.stderr
        assert "release 2.0.0 stored at" in " ".join(proc.stdout.split())
        assert node.status()["selected"] == "2.0.0"
