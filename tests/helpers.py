"""Builders for tests: a node in a temporary root with fakes only at the process boundary."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from agent_fsm.node.config import Config, Judgment
from agent_fsm.node.releases import store as release_store
from agent_fsm.node.releases import tree as release_tree
from agent_fsm.testing import FakeClock, FakePublisher, FakeSystemd
from agent_fsm.wiring import Node, open_node

DEFAULT_CONFIG = Config(
    name="agent", judgment=Judgment(deadline_seconds=60, soak_seconds=5, max_attempts=3)
)


@dataclass
class World:
    """One node below `root`, with its fakes at hand."""

    root: Path
    node: Node
    systemd: FakeSystemd
    publisher: FakePublisher
    clock: FakeClock

    @property
    def paths(self):  # type: ignore[no-untyped-def]
        return self.node.paths

    def reopen(self) -> World:
        """A fresh node over the same files, as after a restart of the process."""
        return make_world(self.root, self.node.config, self.systemd, self.publisher, self.clock)

    def add_release(self, version: str, *, agent_unit: str | None = None,
                    recovery_unit: str | None = None, recovery_script: str | None = None) -> Path:
        """Store a release with the packaged templates, or with the given (e.g. broken) ones, and
        record its digest as `release add` does."""
        release = self.paths.releases_dir / version
        templates = release / "assets"
        templates.mkdir(parents=True)
        packaged = resources.files("agent_fsm") / "templates"
        for name, override in (("agent.service", agent_unit), ("recovery.service", recovery_unit),
                               ("recovery.sh", recovery_script)):
            text = override if override is not None else (packaged / name).read_text()
            (templates / name).write_text(text)
        (release / "release.toml").write_text(f'version = "{version}"\n')
        self.record_digest(version)
        return release

    def record_digest(self, version: str) -> None:
        """Record the stored release's digest as it is now (a test that changes a release on
        purpose, before it is used, records it again)."""
        releases_dir = self.paths.releases_dir
        manifest = release_store.manifest(release_tree.scan(releases_dir / version))
        release_store.record(releases_dir, version, manifest)

    def assets_on_disk(self) -> dict[str, bytes | None]:
        out: dict[str, bytes | None] = {}
        for p in (self.paths.agent_unit, self.paths.recovery_unit, self.paths.recovery_script):
            out[p.name] = p.read_bytes() if p.exists() else None
        return out

    def rendered(self, version: str) -> dict[str, bytes]:
        return {a.path.name: a.content for a in self.node.effectors.rendered(version)}

    # Driving the machine into each state, through its real transitions --------------------
    def installed(self, version: str = "1.0.0") -> World:
        if not self.node.effectors.releases.exists(version):
            self.add_release(version)
        self.node.controller.fire("install", release=version)
        self.node.controller.fire("settle")  # what the daemon does at start: opens the gate
        return self

    def upgrading(self, to: str = "2.0.0", **templates: str) -> World:
        self.add_release(to, **templates)
        self.node.controller.fire("begin_upgrade", release=to)
        self.node.controller.fire("candidate_started")
        return self


def make_world(root: Path, config: Config | None = None, systemd: FakeSystemd | None = None,
               publisher: FakePublisher | None = None, clock: FakeClock | None = None) -> World:
    config = config or DEFAULT_CONFIG
    systemd = systemd or FakeSystemd()
    publisher = publisher or FakePublisher()
    clock = clock or FakeClock()
    node = open_node(config, root, systemd=systemd, publisher=publisher, clock=clock)
    # As systemd's RuntimeDirectory= does while the agent unit runs: the gate's directory.
    node.paths.gate_file.parent.mkdir(parents=True, exist_ok=True)
    # The host below the root has the config's python (release add runs it there, as a container
    # driving its host does): the one this machine has at that path.
    host_python = node.paths.real(config.python)
    if not host_python.exists() and config.python.exists():
        host_python.parent.mkdir(parents=True, exist_ok=True)
        host_python.symlink_to(config.python)
    return World(root, node, systemd, publisher, clock)


def env_with_stub_systemctl(tmp_path: Path) -> dict[str, str]:
    """The environment for a child process whose `systemctl` is a stub that succeeds: the one
    process boundary the unit tests fake."""
    import os

    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    stub = bindir / "systemctl"
    stub.write_text("#!/bin/sh\n[ \"$1\" = --version ] && echo 'systemd 252 (252)'\nexit 0\n")
    stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    env.pop("NOTIFY_SOCKET", None)
    env.pop("WATCHDOG_USEC", None)
    env.pop("WATCHDOG_PID", None)
    return env


def copy_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, symlinks=True)


class Crash(BaseException):
    """Stands for the process dying at a failpoint: nothing below catches a BaseException."""


def crash_at(trigger: str, index: int) -> Callable[[str, int], None]:
    """A failpoint that crashes just before effect `index` of `trigger`."""
    def failpoint(t: str, k: int) -> None:
        if (t, k) == (trigger, index):
            raise Crash(f"{t}:{k}")
    return failpoint


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The one line a failed command printed on stderr, with no traceback."""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]
