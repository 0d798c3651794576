"""The Debian 13 node itself: what `node_sandbox`'s systemd257 boots is that node, and booting
it leaves the cached tree and the host as they were."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import agent_fsm
from agent_fsm_lab import rootfs
from agent_fsm_lab.lab import UNIT, Lab
from agent_fsm_lab.sandbox import SystemdSandbox

pytestmark = pytest.mark.e2e


def test_node_runs_systemd_257_and_python_313(debian13: SystemdSandbox) -> None:
    """Inside the node, PID 1 is systemd 257, `systemctl --version` says 257 and python3 is 3.13:
    the node's own, not the host's 252 and 3.11."""
    assert debian13.systemctl("--version").stdout.startswith("systemd 257 ")
    assert debian13.run("readlink", "/proc/1/exe").stdout.strip() == "/usr/lib/systemd/systemd"
    assert debian13.run("python3", "--version").stdout.startswith("Python 3.13.")
    assert "VERSION_CODENAME=trixie" in debian13.run("cat", "/etc/os-release").stdout


def test_node_never_writes_the_cached_tree(debian13_node: rootfs.Node,
                                           debian13: SystemdSandbox) -> None:
    """What the node writes anywhere in its root (/etc, /usr) is its own: visible inside, absent
    from the cached tree, which other nodes boot at the same time, and gone after shutdown."""
    tree = debian13_node.rootfs
    for path in ("/etc/agent-fsm-e2e-probe", "/usr/local/bin/agent-fsm-e2e-probe"):
        debian13.run("sh", "-c", f"echo inside > {path}")
        assert debian13.run("cat", path).stdout == "inside\n"
        assert debian13.host_path(path).read_text() == "inside\n"
        assert not (tree / path.lstrip("/")).exists(), f"{path} was written into {tree}"
    upper = debian13.test_dir / ".node"
    debian13.shutdown()
    assert not upper.exists()
    assert not (tree / "etc" / "agent-fsm-e2e-probe").exists()
    assert json.loads((tree / rootfs.STAMP).read_text())["systemd"].startswith("systemd 257 ")


def test_release_packed_for_the_node_runs_on_its_python(debian13: SystemdSandbox) -> None:
    """A release the lab packs (here, on the host's Python) covers any CPython 3.11+ (its
    python.toml) and its daemon runs under the node's own python3 (3.13), converged and
    active."""
    lab = Lab(debian13)
    lab.pack("1.0.0")
    status = lab.install("1.0.0")
    assert (status["selected"], status["state"]) == ("1.0.0", "converged")
    needs = (lab.packs / "1.0.0" / "python.toml").read_text()
    assert "requires_python" in needs and "cache_tag" not in needs, needs
    argv = debian13.run("cat", f"/proc/{lab.main_pid()}/cmdline").stdout.split("\0")
    assert argv[0] == "/usr/bin/python3" and "daemon" in argv, (argv, debian13.diagnostics(UNIT))
    assert debian13.run("readlink", "-f", "/usr/bin/python3").stdout.strip() == "/usr/bin/python3.13"


def test_cli_byte_code_is_kept_between_calls(debian13: SystemdSandbox) -> None:
    """The lab's CLI calls on the node write the node's Python's byte code of agent_fsm once,
    outside the read-only checkout, so a later call loads it instead of compiling again."""
    lab = Lab(debian13)
    lab.cli("--version")
    checkout = Path(agent_fsm.__file__).resolve().parent
    compiled = Lab.pycache(debian13) / str(checkout).lstrip("/") / "cli"
    assert sorted(p.name for p in compiled.glob("app.cpython-313*.pyc")) \
        == ["app.cpython-313.pyc"], compiled
    before = (compiled / "app.cpython-313.pyc").stat().st_mtime_ns
    lab.cli("--version")
    assert (compiled / "app.cpython-313.pyc").stat().st_mtime_ns == before


def test_a_release_added_on_the_node_starts_from_its_pythons_byte_code(
        debian13: SystemdSandbox) -> None:
    """A release packed on the host's Python and added on the node carries byte code for the
    node's python3 (3.13) for every agent_fsm module, and the node's python3 runs `--version`
    from the stored release without compiling any of them from source."""
    lab = Lab(debian13)
    lab.pack("1.0.0")
    lab.install("1.0.0")
    lib = lab.state_dir / "releases" / "1.0.0" / "lib"
    sources = sorted(p.relative_to(lib) for p in (lib / "agent_fsm").rglob("*.py"))
    compiled = sorted(p.parent.parent.relative_to(lib) / f"{p.name.split('.')[0]}.py"
                      for p in (lib / "agent_fsm").rglob("__pycache__/*.cpython-313.pyc"))
    assert sources and compiled == sources
    verbose = debian13.run("python3", "-I", "-S", "-B", "-v", str(lib / "agent-fsm-boot.py"),
                           "--version").stderr
    from_source = [line for line in verbose.splitlines()
                   if line.startswith(f"# code object from {lib}/agent_fsm/")]
    assert from_source == [] and f"{lib}/agent_fsm/__pycache__/" in verbose, from_source[:3]
