"""The Debian 13 node itself: what `node_sandbox`'s systemd257 boots is that node, and booting
it leaves the cached tree and the host as they were."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from agent_fsm_lab import rootfs
from agent_fsm_lab.lab import UNIT, Lab
from agent_fsm_lab.sandbox import SystemdSandbox, missing_requirements
from tests.e2e.conftest import require_sandbox

pytestmark = pytest.mark.e2e


@pytest.fixture
def node(debian13_node: rootfs.Node) -> Iterator[SystemdSandbox]:
    """A booted Debian 13 node; shut down after the test."""
    require_sandbox(*missing_requirements(debian13_node.rootfs), what="the Debian 13 node needs")
    sandbox = rootfs.sandbox(debian13_node)
    try:
        sandbox.boot()
        yield sandbox
    finally:
        sandbox.shutdown()


def test_node_runs_systemd_257_and_python_313(node: SystemdSandbox) -> None:
    """Inside the node, PID 1 is systemd 257, `systemctl --version` says 257 and python3 is 3.13:
    the node's own, not the host's 252 and 3.11."""
    assert node.systemctl("--version").stdout.startswith("systemd 257 ")
    assert node.run("readlink", "/proc/1/exe").stdout.strip() == "/usr/lib/systemd/systemd"
    assert node.run("python3", "--version").stdout.startswith("Python 3.13.")
    assert "VERSION_CODENAME=trixie" in node.run("cat", "/etc/os-release").stdout


def test_node_never_writes_the_cached_tree(debian13_node: rootfs.Node,
                                           node: SystemdSandbox) -> None:
    """What the node writes anywhere in its root (/etc, /usr) is its own: visible inside, absent
    from the cached tree, which other nodes boot at the same time, and gone after shutdown."""
    tree = debian13_node.rootfs
    for path in ("/etc/agent-fsm-e2e-probe", "/usr/local/bin/agent-fsm-e2e-probe"):
        node.run("sh", "-c", f"echo inside > {path}")
        assert node.run("cat", path).stdout == "inside\n"
        assert node.host_path(path).read_text() == "inside\n"
        assert not (tree / path.lstrip("/")).exists(), f"{path} was written into {tree}"
    upper = node.test_dir / ".node"
    node.shutdown()
    assert not upper.exists()
    assert not (tree / "etc" / "agent-fsm-e2e-probe").exists()
    assert json.loads((tree / rootfs.STAMP).read_text())["systemd"].startswith("systemd 257 ")


def test_release_packed_for_the_node_runs_on_its_python(node: SystemdSandbox) -> None:
    """A release the lab packs (here, on the host's Python) covers any CPython 3.11+ (its
    python.toml) and its daemon runs under the node's own python3 (3.13), converged and
    active."""
    lab = Lab(node)
    lab.pack("1.0.0")
    status = lab.install("1.0.0")
    assert (status["selected"], status["state"]) == ("1.0.0", "converged")
    needs = (lab.packs / "1.0.0" / "python.toml").read_text()
    assert "requires_python" in needs and "cache_tag" not in needs, needs
    argv = node.run("cat", f"/proc/{lab.main_pid()}/cmdline").stdout.split("\0")
    assert argv[0] == "/usr/bin/python3" and "daemon" in argv, (argv, node.diagnostics(UNIT))
    assert node.run("readlink", "-f", "/usr/bin/python3").stdout.strip() == "/usr/bin/python3.13"
