"""A node under a private systemd: what the lab's `try` and `demo` and the end-to-end tests drive.

`Lab` configures an agent named `agent` in a booted `SystemdSandbox`: its state and scripts in
the sandbox's test directory, its units in the sandbox's private unit directory, a health check
from the host's config. It packs releases of four kinds:

- good: its workload writes `<test_dir>/health.d/health` with its version, so the check passes
  (the workload sees the state dir read-only; the lab's drop-in lets the unit write health.d);
- unhealthy: its workload never writes the health file, and it ships broken assets;
- crash: its binary exits 3 at start, and it ships broken assets;
- silent: its binary runs but never sends READY=1 (systemd's start timeout judges it);
- racing: unhealthy, and its own code would break the way back (it renders every unit with a
  binary that does not exist), and its start may be held (`hold-start`, with faults=True).

Broken assets name a binary that does not exist and a recovery script that exits 1: had the
candidate's assets been written before its judgment, its own rollback would break.

With `faults=True` the lab can also break the host around the agent, on request, through flag
files in `<test_dir>/faults/` (`Lab.fault(name)` sets one, `Lab.fault(name, False)` clears it):

- the node's publisher: `publish_command` is the lab's script, which delivers each result into
  `<test_dir>/outbox/` (`Lab.published()`), fails while `publish-fails` is set and never answers
  while `publish-hangs` is set;
- systemctl: the CLI (`Lab.cli`), the agent unit and the recovery unit find a wrapper first in
  their PATH, which refuses the verb V ("Access denied", exit 1) while `refuse-V` is set, e.g.
  `refuse-reset-failed`, `refuse-daemon-reload`, answers it only after S seconds while `slow-V`
  holds S (`slow-recovery-V`: the recovery unit's calls alone; `Lab.slow`), and otherwise runs
  the real systemctl;
- a start of a `racing` release (its own launcher, see `Lab.pack`) that resolved `selected`
  waits, while `hold-start` is set, until `selected` names another release: the race of a
  `Restart=` start with `recover` on a slow host, made certain.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import agent_fsm
from agent_fsm import files
from agent_fsm.actions.releases import packing, vendoring

from .sandbox import SystemdSandbox, python_paths, under_private_tmp

Kind = Literal["good", "unhealthy", "crash", "silent", "racing"]
NAME = "agent"
UNIT = f"{NAME}.service"
RECOVERY_UNIT = f"{NAME}-recovery.service"

BROKEN_ASSETS = {
    "agent.service": "[Unit]\nDescription=broken candidate ${version}\n\n[Service]\n"
                     "ExecStart=/nonexistent/${name}-${version}\n",
    "recovery.service": "[Unit]\nDescription=broken recovery of ${version}\n\n[Service]\n"
                        "Type=oneshot\nExecStart=/bin/false\n",
    "recovery.sh": "#!/bin/sh\necho 'broken recovery script of ${version}' >&2\nexit 1\n",
}


# The interpreter the units run releases with (the config's `python`): the node's own, never
# this harness's venv; Debian's python3 (3.11 on the host; 3.13 on a Debian 13 node, which runs
# the releases packed here as any node of the fleet does: they are pure Python).
NODE_PYTHON = "/usr/bin/python3"

# The PATH systemd gives services (and `SystemdSandbox.run` gives commands).
SERVICE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

SYSTEMCTL_WRAPPER = """#!/bin/sh
# The lab's systemctl: the real one, except a verb V refused while $faults/refuse-V exists.
faults={faults}
if [ -n "${{1:-}}" ] && [ -e "$faults/refuse-$1" ]; then
    echo "Failed to $*: Access denied (fault injected by the lab)" >&2
    exit 1
fi
if [ -n "${{1:-}}" ] && [ -e "$faults/slow-$1" ]; then
    sleep "$(cat "$faults/slow-$1")"
fi
if [ -n "${{1:-}}" ] && [ "${{AGENT_FSM_RECOVERY:-}}" = unit ] \
        && [ -e "$faults/slow-recovery-$1" ]; then
    sleep "$(cat "$faults/slow-recovery-$1")"  # the recovery unit's calls only
fi
exec {systemctl} "$@"
"""

# A racing release's bin/agent-fsm: resolves `selected` as every launcher does, then (while the
# lab's hold-start flag is set) waits until `selected` names another release, at most 20 s.
HELD_LAUNCHER = """#!/bin/sh
here=$(dirname "$(readlink -f "$0")")
if [ -e {faults}/hold-start ]; then
    i=0
    while [ "$(readlink -f {selected})" = "$(dirname "$here")" ] && [ $i -lt 200 ]; do
        sleep 0.1; i=$((i + 1))
    done
fi
exec "$here/agent-fsm.real" "$@"
"""

# Appended to a racing release's own agent_fsm/node/assets/render.py: its code renders every
# unit with a binary that does not exist (a bug that only its way back would show).
BROKEN_RENDER = """

_lab_render = render


def render(release_dir, paths, version):  # type: ignore[no-redef]
    return tuple(a._replace(content=a.content.replace(b"ExecStart=", b"ExecStart=/nonexistent"))
                 if a.path.name.endswith(".service") else a
                 for a in _lab_render(release_dir, paths, version))
"""

PUBLISHER = """#!/bin/sh
# The lab's publisher: fails while $faults/publish-fails exists, never answers while
# $faults/publish-hangs exists; else delivers the result (JSON on stdin) into the outbox.
faults={faults} outbox={outbox}
if [ -e "$faults/publish-fails" ]; then
    echo "publisher unreachable (fault injected by the lab)" >&2
    exit 1
fi
while [ -e "$faults/publish-hangs" ]; do sleep 0.2; done
tmp="$outbox/.$$.tmp"
cat > "$tmp"
mv "$tmp" "$outbox/$(date +%s%N)-$$.json"
"""


# A directory where `Lab` keeps the releases it packed (and the dependencies it vendored for a
# node of its own tree), for every process of a test run that is given it (the suite's conftest
# sets it; unset: each is made afresh). Packing is a pure function of the version, the kind and
# the workload (for this tree of agent-fsm) and costs seconds of CPU (vendoring, byte-compiling):
# a run makes each once, and each lab gets a copy of its own.
PACK_CACHE_ENV = "AGENT_FSM_LAB_PACK_CACHE"

# The good kind's workload: the health file is `<test_dir>/health.d/health` (the store keeps a
# release in `<test_dir>/state/releases/<version>`), named without any one node's path, so one
# packed release serves every lab of a run.
GOOD_WORKLOAD = ("/bin/sh", "-c",
                 'echo "$AGENT_FSM_VERSION" > "$AGENT_FSM_RELEASE_DIR/../../../health.d/health"; '
                 "exec sleep infinity")


def cached(key: list[Any], output: Path, make: Callable[[Path], object]) -> None:
    """`make(path)` writes a tree at `path` that depends on `key` only (for this tree of
    agent-fsm); with a cache (PACK_CACHE_ENV), it runs once a run for each key, and `output` is
    a copy of what it made."""
    cache = os.environ.get(PACK_CACHE_ENV)
    if not cache:
        make(output)
        return
    name = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:24]
    entry = Path(cache) / name
    # One process makes it while the others wait (the suite's workers start alike); it appears
    # whole (made aside, then renamed), so a process that finds it never waits.
    with (Path(cache) / f".{name}.lock").open("w") as lock:
        if not entry.is_dir():
            fcntl.flock(lock, fcntl.LOCK_EX)
        if not entry.is_dir():
            with files.private_dir(Path(cache), f".{name}.") as staging:
                make(staging / "tree")
                (staging / "tree").rename(entry)
    output.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(entry, output, symlinks=True)


class Lab:
    def __init__(self, sandbox: SystemdSandbox, *, deadline: float = 6, soak: float = 1,
                 max_attempts: int = 2, restart: float | None = None, faults: bool = False,
                 config_extra: dict[str, Any] | None = None, checks: str | None = None) -> None:
        """Configure the agent (see the module docstring); `restart`: `restart_seconds` (the
        unit's RestartSec=; the default, 1, when None); `faults`: set up the fault kit;
        `config_extra`: more top-level config keys (values written as TOML via JSON, so
        strings, numbers and lists of them); `checks`: the `[judgment] checks` value as TOML
        instead of the health-file check (e.g. an HTTP check's inline table)."""
        self.sb = sandbox
        self.dir = sandbox.test_dir
        self.state_dir = self.dir / "state"
        self.packs = self.dir / "packs"
        self.config = self.dir / "config.toml"
        self.faults_dir = self.dir / "faults"
        self.outbox = self.dir / "outbox"
        # Every `cli` call gets these; the CLI inside runs the agent_fsm this harness packs from
        # (the same one as the .venv's editable install, unless run from another checkout),
        # with `self.python`: this harness's interpreter on the host's systemd; on a node booted
        # from its own tree (`rootfs`), the node's python3, with agent-fsm's dependencies as a
        # release vendors them (`vendoring.vendor`, from this harness's environment) in `deps`.
        package_root = Path(agent_fsm.__file__).resolve().parents[1]
        pythonpath = [str(package_root)]
        self.python = sys.executable
        if sandbox.rootfs is not None:
            self.python = NODE_PYTHON
            cached(["deps"], self.dir / "deps", vendoring.vendor)
            pythonpath.append(str(self.dir / "deps"))
        self.env: dict[str, str] = {"COLUMNS": "120", "PYTHONPATH": ":".join(pythonpath)}
        if sandbox.rootfs is not None:
            # The checkout is read-only inside and holds no byte code for the node's Python:
            # without a place to write it, every call compiled agent_fsm again.
            self.env["PYTHONPYCACHEPREFIX"] = str(self.pycache(sandbox))
        extra = dict(config_extra or {})
        python = str(extra.pop("python", NODE_PYTHON))
        # `agent-fsm` on PATH, in the test's directory: the sandbox shares the host's /usr/local.
        self.bin_link = self.dir / "bin" / "agent-fsm"
        extra.setdefault("bin_link", str(self.bin_link))
        if faults:
            extra.setdefault("publish_command", [str(self._setup_faults())])
        # The workloads' health file: outside the state dir, which a workload sees read-only;
        # the agent unit may write its directory (a drop-in, so every release's unit has it).
        self.health = self.dir / "health.d" / "health"
        self.health.parent.mkdir(mode=0o777, exist_ok=True)
        self.health.parent.chmod(0o777)  # a workload of any user may say it is healthy
        self.dropin(UNIT, "lab-health", f"[Service]\nReadWritePaths=-{self.health.parent}\n",
                    reload=False)
        health = self.health
        check = f'test "$(cat {health} 2>/dev/null)" = "$AGENT_FSM_VERSION"'
        self.config.write_text(
            f'name = "{NAME}"\n'
            f'state_dir = "{self.state_dir}"\n'
            f'lib_dir = "{self.dir / "lib"}"\n'
            'unit_dir = "/etc/systemd/system"\n'
            f'run_dir = "/run/{NAME}"\n'
            f'python = "{python}"\n'
            + "".join(f"{key} = {json.dumps(value)}\n" for key, value in extra.items()
                      if value is not None)  # None: the key left out (an older reader's config)
            + "[judgment]\n"
            f"deadline_seconds = {deadline}\n"
            f"soak_seconds = {soak}\n"
            f"max_attempts = {max_attempts}\n"
            + ("" if restart is None else f"restart_seconds = {restart}\n")
            + "checks = " + (checks or f"[[\"/bin/sh\", \"-c\", {json.dumps(check)}]]") + "\n"
        )

        if any(under_private_tmp(p) for p in python_paths()):
            # The Python running agent-fsm lives under /tmp (a checkout there): the unit's own
            # PrivateTmp= would hide it from the daemon. Only this lab relaxes it, by a drop-in.
            dropin = sandbox.host_path(f"/etc/systemd/system/{UNIT}.d")
            dropin.mkdir(parents=True, exist_ok=True)
            (dropin / "lab-python-under-tmp.conf").write_text("[Service]\nPrivateTmp=no\n")

    @staticmethod
    def pycache(sandbox: SystemdSandbox) -> Path:
        """Where the CLI's byte code goes on a node of its own tree: in the sandbox's own
        directory, so the labs of a shared node reuse it."""
        return sandbox.own_dir / "pycache"

    # Host setup and faults --------------------------------------------------------------
    def dropin(self, unit: str, name: str, text: str, reload: bool = True) -> Path:
        """Write drop-in `<unit>.d/<name>.conf` (it survives the agent's asset writes)."""
        directory = self.sb.host_path(f"/etc/systemd/system/{unit}.d")
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{name}.conf"
        path.write_text(text)
        if reload:
            self.sb.systemctl("daemon-reload")
        return path

    def _setup_faults(self) -> Path:
        """The systemctl wrapper first in every PATH that calls it, and the publisher."""
        bin_dir = self.faults_dir / "bin"
        bin_dir.mkdir(parents=True)
        self.outbox.mkdir(mode=0o755)
        real = shutil.which("systemctl", path="/usr/bin:/bin") or "/bin/systemctl"
        wrapper = bin_dir / "systemctl"
        wrapper.write_text(SYSTEMCTL_WRAPPER.format(faults=self.faults_dir, systemctl=real))
        wrapper.chmod(0o755)
        publisher = self.faults_dir / "publish"
        publisher.write_text(PUBLISHER.format(faults=self.faults_dir, outbox=self.outbox))
        publisher.chmod(0o755)
        path = f"{bin_dir}:{SERVICE_PATH}"
        self.env["PATH"] = path
        # The agent unit is ProtectSystem=strict: the publisher it runs may write the outbox.
        self.dropin(UNIT, "lab-faults", f"[Service]\nEnvironment=PATH={path}\n"
                    f"ReadWritePaths=-{self.outbox}\n", reload=False)
        self.dropin(RECOVERY_UNIT, "lab-faults", f"[Service]\nEnvironment=PATH={path}\n",
                    reload=False)
        return publisher

    def slow(self, verb: str, seconds: float | None, *, recovery_only: bool = False) -> None:
        """Make systemctl answer `verb` only after `seconds` (None: at once again); with
        `recovery_only`, only when the recovery unit asks (its `recover`)."""
        flag = self.faults_dir / f"slow-{'recovery-' if recovery_only else ''}{verb}"
        if seconds is None:
            flag.unlink(missing_ok=True)
        else:
            flag.write_text(f"{seconds:g}\n")

    def fault(self, name: str, on: bool = True) -> None:
        """Set (or clear) a fault flag: `publish-fails`, `publish-hangs`, `refuse-<verb>`."""
        if not self.faults_dir.is_dir():
            raise RuntimeError("this Lab was made without faults=True")
        flag = self.faults_dir / name
        if on:
            flag.write_text("on\n")
        else:
            flag.unlink(missing_ok=True)

    def published(self) -> list[dict[str, Any]]:
        """The results the lab's publisher delivered, oldest first."""
        if not self.outbox.is_dir():
            return []
        return [json.loads(p.read_text()) for p in sorted(self.outbox.glob("*.json"))]

    # Releases ---------------------------------------------------------------------------
    def pack(self, version: str, kind: Kind = "good",
             workload: tuple[str, ...] | None = None, add: bool = True) -> Path:
        """Pack a release of the given kind and add it to the node (`workload`: its own
        instead of the kind's; `add=False`: leave adding it to the caller)."""
        if workload is None:
            workload = GOOD_WORKLOAD
            if kind in ("unhealthy", "racing"):
                workload = ("/bin/sh", "-c", "exec sleep infinity")
        path = self.packs / version

        def make(at: Path) -> None:
            packing.pack(version, at, workload)  # here, for every node: one artifact for all
            if kind != "good":
                for name, text in BROKEN_ASSETS.items():
                    (at / "assets" / name).write_text(text)
            launcher = at / "bin" / "agent-fsm"
            if kind == "crash":
                launcher.write_text("#!/bin/sh\necho 'candidate crashes at start' >&2\nexit 3\n")
            elif kind == "silent":
                launcher.write_text("#!/bin/sh\necho 'candidate never says READY=1' >&2\n"
                                    "exec sleep infinity\n")

        if kind == "racing":  # its launcher names this lab's paths: packed for it alone
            make(path)
            launcher = path / "bin" / "agent-fsm"
            launcher.rename(launcher.with_name("agent-fsm.real"))
            launcher.write_text(HELD_LAUNCHER.format(faults=self.faults_dir,
                                                     selected=self.state_dir / "selected"))
            launcher.chmod(0o755)
            with (path / "lib" / "agent_fsm" / "node" / "assets" / "render.py").open("a") as f:
                f.write(BROKEN_RENDER)
        else:
            cached(["release", version, kind, list(workload)], path, make)
        if add:
            self.cli("release", "add", str(path))
        return path

    # Driving ----------------------------------------------------------------------------
    def cli(self, *args: str, check: bool = True, timeout: float = 300,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run agent-fsm inside the sandbox, as an operator on that host would (`env`: more
        environment for this call, e.g. a failpoint)."""
        return self.sb.run(self.python, "-m", "agent_fsm", "--config", str(self.config),
                           *args, check=check, timeout=timeout, env={**self.env, **(env or {})})

    def status(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.cli("status", "--json").stdout)
        return data

    def history(self) -> list[dict[str, Any]]:
        data: list[dict[str, Any]] = json.loads(self.cli("history", "--json",
                                                         "--limit", "1000").stdout)
        return data

    def asset(self, name: str) -> bytes:
        """An asset as it is on the node's disk (units live in the sandbox's private tmpfs)."""
        if name.endswith(".sh"):
            return (self.dir / "lib" / name).read_bytes()
        return self.sb.host_path(f"/etc/systemd/system/{name}").read_bytes()

    def assets(self) -> dict[str, bytes]:
        return {n: self.asset(n) for n in (UNIT, RECOVERY_UNIT, f"{NAME}-recovery.sh")}

    def why(self) -> str:
        """What an operator would read when a check fails: `agent-fsm status`, then both units'
        status and journals and the console's tail."""
        try:
            status = self.cli("status", check=False, timeout=20)
            head = f"\n--- agent-fsm status\n{status.stdout}{status.stderr}"
        except subprocess.SubprocessError as exc:
            head = f"\n--- agent-fsm status failed: {exc}"
        return head + "\n" + self.sb.diagnostics(UNIT, RECOVERY_UNIT)

    def settled(self, timeout: float = 60) -> dict[str, Any]:
        """Wait until the agent is active with the gate open and nothing pending."""
        last: dict[str, Any] = {}

        def done() -> bool:
            nonlocal last
            last = self.status()
            return (last["state"] == "converged" and last["gate"] == "open"
                    and last["signal"] is None and last["owed"] is None
                    and self.sb.show(UNIT, "ActiveState") == "active")

        self.sb.wait_for(done, timeout, "the agent to settle (active, gate open, no signal)",
                         units=(UNIT, RECOVERY_UNIT))
        return last

    def install(self, version: str) -> dict[str, Any]:
        self.cli("install", "--version", version)
        return self.settled()

    def main_pid(self) -> int:
        return int(self.sb.show(UNIT, "MainPID"))


def wait_until(predicate: Any, timeout: float, interval: float = 0.1) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return False


def installed(sandbox: SystemdSandbox, **options: Any) -> Lab:
    """A node converged on a good 1.0.0 (judgment: 3 s deadline, 1 s soak unless given)."""
    options.setdefault("deadline", 3)
    options.setdefault("soak", 1)
    lab = Lab(sandbox, **options)
    lab.pack("1.0.0")
    lab.install("1.0.0")
    return lab


def output(proc: subprocess.CompletedProcess[str]) -> str:
    """A finished command's exit, stdout and stderr, for an assertion's message."""
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout}--- stderr\n{proc.stderr}"
