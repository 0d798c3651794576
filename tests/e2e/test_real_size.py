"""An agent of a real size, end to end on systemd 252 and 257: a real Node.js runtime in the
payload (the `node` on PATH, with the libraries it needs that a Debian base system lacks) beside
20,000 small files in 200 directories, its workload a small HTTP server run by that `node`,
judged by the host's HTTP check. A good upgrade is judged ok and its store grows by far less
than one release; a candidate that exits at start and one whose check fails are rolled back,
and the way back writes nothing to the store.

The payload and the four releases are packed once for the module, on the real disk below the
sandboxes' base directory (a sandbox's /tmp is its own; the 257 node sees them read-only at the
same path), and removed in the background afterwards. Each node kind is installed once for
the module: 1.0.0 installed, the three others added (the store's growth measured at each add);
its tests then run on that node in turn, each from whatever good version it converged on (the
rollbacks leave it where it was), so a failed test leaves the ones after it a node as it found it
or a clear failure of their own.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import socket
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent_fsm.actions.releases import packing
from agent_fsm_lab.lab import Lab, output, wait_until
from agent_fsm_lab.sandbox import (
    DEFAULT_BASE_DIR,
    SystemdSandbox,
)
from tests.e2e.conftest import SharedNode, _remove_later, require_sandbox

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("real-size")]  # one module fixture
if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark.append(pytest.mark.timeout(300))  # a safety net only: every wait here is bounded

SMALL_FILES, SMALL_DIRS, SMALL_BYTES = 20_000, 200, 200
# Libraries every Debian base system has (glibc's, and the C++ runtime apt itself links):
# `node` finds them on the node; any other library it links is shipped in payload/lib.
BASE_LIBS = re.compile(r"^(ld-linux[-\w]*|lib(c|m|dl|pthread|rt|resolv|stdc\+\+|gcc_s))\.so\b")
# The payload's node, with its own libraries first: no shell runs it, env(1) sets the path.
WORKLOAD = ("/usr/bin/env", "LD_LIBRARY_PATH={payload_dir}/lib", "{payload_dir}/bin/node",
            "{payload_dir}/server.js")
SERVER = """// The agent {version}: GET /health on 127.0.0.1:$PORT answers {status} with its version.
const http = require("http");
const VERSION = "{version}";
{start}
http.createServer((req, res) => {{
  res.writeHead(req.url === "/health" ? {status} : 404, {{"Content-Type": "text/plain"}});
  res.end(VERSION + "\\n");
}}).listen(Number(process.env.PORT), "127.0.0.1",
          () => console.log(`agent ${{VERSION}} listening on 127.0.0.1:${{process.env.PORT}}`));
"""
EXITS = 'console.error(`agent ${VERSION}: cannot start: bad build`); process.exit(1);'
# Version: (what /health answers, what the server does first). 1.1.0 differs from 1.0.0 in
# server.js alone, and so do the two bad candidates.
VERSIONS = {"1.0.0": (200, ""), "1.1.0": (200, ""), "1.2.0": (200, EXITS), "1.3.0": (500, "")}


def node_runtime() -> Path:
    """The real `node` on PATH; skipped (failed under CI=true) where there is none."""
    found = shutil.which("node")
    require_sandbox(*([] if found else ["`node` on PATH (`make system-packages` installs "
                                        "Debian's nodejs where it is missing)"]),
                    what="the real-size e2e tests need")
    assert found is not None
    return Path(found).resolve()


def linked_libraries(binary: Path) -> list[Path]:
    """The libraries `ldd` resolves for `binary` that a Debian base system lacks (Debian's
    nodejs: libnode and what it links; the official build: none)."""
    proc = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, timeout=30,
                          check=True)
    found = re.findall(r"^\s*(\S+) => (/\S+)", proc.stdout, re.M)
    return [Path(path) for name, path in found if not BASE_LIBS.match(name)]


def make_payload(where: Path) -> dict[str, Any]:
    """The agent's tree: bin/node, lib/ (its libraries beyond the base system), and
    node_modules/ of 20,000 files of 200 bytes in 200 directories."""
    runtime = node_runtime()
    (where / "bin").mkdir(parents=True)
    shutil.copy2(runtime, where / "bin" / "node")
    (where / "lib").mkdir()
    libs = linked_libraries(runtime)
    for lib in libs:
        shutil.copy2(lib.resolve(), where / "lib" / lib.name)
    for d in range(SMALL_DIRS):
        sub = where / "node_modules" / f"pkg{d:03d}"
        sub.mkdir(parents=True)
        for i in range(SMALL_FILES // SMALL_DIRS):
            text = f"module.exports = {d * 1000 + i}; // pkg{d:03d}/f{i:03d}\n"
            (sub / f"f{i:03d}.js").write_text(text.ljust(SMALL_BYTES - 1) + "\n")
    return {"runtime": str(runtime), "libs": [lib.name for lib in libs]}


@dataclass(frozen=True)
class Packed:
    """The module's releases, packed once: `packs/<version>`."""

    packs: Path
    made: dict[str, Any]


@pytest.fixture(scope="module")
def packed() -> Iterator[Packed]:
    """The payload and the four releases, made once on the real disk (see the docstring)."""
    node_runtime()
    DEFAULT_BASE_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    base = DEFAULT_BASE_DIR / f"real-size-{uuid.uuid4().hex[:12]}"
    base.mkdir(mode=0o755)
    try:
        payload = base / "payload"
        made = make_payload(payload)
        for version, (status, start) in VERSIONS.items():
            (payload / "server.js").write_text(SERVER.format(version=version, status=status,
                                                             start=start))
            packing.pack(version, base / "packs" / version, WORKLOAD, payload=payload)
        yield Packed(base / "packs", made)
    finally:
        _remove_later(base, DEFAULT_BASE_DIR)  # 100,000 files: seconds of unlinking


@pytest.fixture(scope="module")
def node_keep(packed: Packed) -> tuple[Path, ...]:
    """The 257 node sees the packs (read-only)."""
    return (packed.packs,)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Agent:
    """The lab's node with the Node.js agent: an HTTP check on a free port of its own, the
    workload run as `nobody` with PORT in its environment."""

    def __init__(self, sandbox: SystemdSandbox, packed: Packed) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/health"
        self.lab = Lab(sandbox, deadline=10, soak=1, max_attempts=2,
                       checks=f'[{{ http = "{self.url}", status = 200, timeout_seconds = 2 }}]')
        with self.lab.config.open("a") as config:
            config.write(f'[workload]\nuser = "nobody"\nenvironment = {{ PORT = "{self.port}" }}\n')
        self.packed = packed
        self.grown: dict[str, int] = {}  # version: the bytes its add took on disk

    def add(self, version: str) -> None:
        """`release add` of `version`'s pack; what the store grew by is kept."""
        before = self.store_bytes()
        self.lab.cli("release", "add", str(self.packed.packs / version))
        self.grown[version] = self.store_bytes() - before

    def health(self) -> tuple[int, str]:
        """What GET /health answers now (the sandbox shares the host's network)."""
        try:
            with urllib.request.urlopen(self.url, timeout=5) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError as exc:
            return 0, str(exc)

    def answers(self, version: str, timeout: float = 30) -> None:
        """/health answers 200 with `version`, within `timeout` seconds: an install or a way
        back ends with the agent unit active, and its workload then starts listening."""
        wait_until(lambda: self.health() == (200, f"{version}\n"), timeout, interval=0.2)
        assert self.health() == (200, f"{version}\n"), self.why()

    def upgrade(self, version: str) -> subprocess.CompletedProcess[str]:
        return self.lab.cli("upgrade", "--to", version, "--wait", "--timeout", "120",
                            check=False, timeout=150)

    def store_bytes(self) -> int:
        """The bytes the store takes on disk (st_blocks), each inode counted once."""
        seen: set[int] = set()
        total = 0
        for top, dirs, names in os.walk(self.lab.state_dir / "releases"):
            for name in (*dirs, *names):
                st = os.lstat(os.path.join(top, name))
                if st.st_ino not in seen:
                    seen.add(st.st_ino)
                    total += st.st_blocks * 512
        return total

    def runs_the_payloads_node(self, status: dict[str, Any], version: str) -> None:
        """The workload `status` names runs, and it is `version`'s stored node."""
        workload = status["workload"]
        assert workload["running"] is True and workload["pid"], workload
        exe = os.readlink(f"/proc/{self.lab.sb.host_pid(int(workload['pid']))}/exe")
        assert exe.endswith(f"/releases/{version}/payload/bin/node"), exe

    def why(self) -> str:
        return self.lab.why()


@pytest.fixture(scope="module")
def agent(_shared_node: SharedNode, packed: Packed,
          request: pytest.FixtureRequest) -> Iterator[Agent]:
    """The node of each kind with 1.0.0 installed and answering, 1.1.0 to 1.3.0 added: one
    store of four real-size releases for the module's tests (see the module docstring)."""
    with _shared_node.lease(request.node) as sandbox:
        agent = Agent(sandbox, packed)
        agent.add("1.0.0")
        agent.lab.install("1.0.0")
        agent.answers("1.0.0")
        for version in ("1.1.0", "1.2.0", "1.3.0"):
            agent.add(version)
        yield agent


def converged_on(status: dict[str, Any], version: str) -> bool:
    return (status["state"] == "converged" and status["selected"] == version
            and status["last_good"] == version and status["gate"] == "open"
            and status["signal"] is None)


def test_a_judged_upgrade_of_a_real_size(agent: Agent) -> None:
    """1.0.0 (node and 20,000 files) installs and answers; 1.1.0, one small file apart, grew
    the store by under 0.2x of one release, is judged ok, and answers as 1.1.0 from its own
    stored node; `status --json` and `doctor` say so."""
    lab = agent.lab
    one, grown = agent.grown["1.0.0"], agent.grown["1.1.0"]
    assert grown <= 0.2 * one, f"the store grew by {grown} bytes for 1.1.0; one release: {one}"

    proc = agent.upgrade("1.1.0")
    assert proc.returncode == 0 and "judged ok" in proc.stdout, output(proc) + agent.why()
    status = lab.settled()
    assert converged_on(status, "1.1.0"), status
    assert (status["last_result"]["to"], status["last_result"]["outcome"]) == ("1.1.0", "ok")
    agent.runs_the_payloads_node(status, "1.1.0")
    agent.answers("1.1.0")
    doctor = lab.cli("doctor", check=False)
    assert doctor.returncode == 0, output(doctor)


def rolled_back(agent: Agent, candidate: str) -> dict[str, Any]:
    """Upgrade the converged node to `candidate`: exit 4, back on the good version it ran,
    which answers from its own node again, the candidate known bad; the store is as it was
    before the upgrade. The last result."""
    lab = agent.lab
    good = lab.settled()["selected"]
    before = agent.store_bytes()
    proc = agent.upgrade(candidate)
    assert proc.returncode == 4, output(proc) + agent.why()
    status = lab.settled()
    assert converged_on(status, good), status
    agent.runs_the_payloads_node(status, good)
    agent.answers(good)
    assert candidate in [k["version"] for k in status["known_bad"]], status["known_bad"]
    assert agent.store_bytes() <= before, "the way back wrote to the store"
    result: dict[str, Any] = status["last_result"]
    assert (result["to"], result["outcome"]) == (candidate, "rolled_back"), result
    return result


def test_a_candidate_that_exits_at_start_is_rolled_back(agent: Agent) -> None:
    """A big candidate whose node exits 1 at start is judged failed and rolled back (exit 4),
    the reason naming the exit and its line on stderr."""
    result = rolled_back(agent, "1.2.0")
    reason = result["reason"]
    assert "exited with status 1" in reason and "cannot start: bad build" in reason, result


def test_a_candidate_whose_check_fails_is_rolled_back(agent: Agent) -> None:
    """A big candidate whose /health answers 500 fails the HTTP check and is rolled back
    (exit 4), the reason naming the check and what it got."""
    result = rolled_back(agent, "1.3.0")
    assert result["reason_class"] == "check_failed", result
    assert agent.url in result["reason"] and "500" in result["reason"], result
