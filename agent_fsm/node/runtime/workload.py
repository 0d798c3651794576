"""`<run_dir>/workload.json`: the daemon's record of the workload it supervises, for `status` and
`metrics`.

The daemon writes it atomically (`files.atomic_write`) when the workload starts and exits. systemd
removes the run dir whenever the agent unit stops, so no record outlives its daemon. Still, a record
is trusted only as far as it can be checked: `running` is shown only while both its `pid` and
`daemon_pid` live. A record left by a daemon killed with SIGKILL, or in a reused run dir, reads as
not running. `view` is the `workload` object of `status --json` (docs/operations.md), null when the
selected release declares no workload.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, NamedTuple

from ... import files
from ...errors import AgentFsmError, ReleaseError
from ..paths import Paths
from ..releases.pointers import read_manifest

MAX_BYTES = 64 << 10


def iso(ts: float) -> str:
    """A time as status shows it: ISO 8601 in UTC, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


class Exit(NamedTuple):
    code: int | None  # the exit status, when it exited
    signal: str | None  # the signal's name ("SIGKILL"), when one ended it
    time: str

    @classmethod
    def of(cls, returncode: int, now: float) -> Exit:
        """From `Popen.returncode` (a negative one is the signal)."""
        if returncode < 0:
            import signal as signals

            try:
                name = signals.Signals(-returncode).name
            except ValueError:
                name = f"signal {-returncode}"
            return cls(None, name, iso(now))
        return cls(returncode, None, iso(now))

    def words(self) -> str:
        return f"killed by {self.signal}" if self.signal else f"exited with status {self.code}"


class Record(NamedTuple):
    """What the daemon knows of its workload."""

    version: str
    command: tuple[str, ...]  # as started, placeholders expanded
    user: str
    running: bool
    pid: int | None
    since: str | None
    restarts: int
    last_exit: Exit | None
    daemon_pid: int

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "command": list(self.command), "user": self.user,
                "running": self.running, "pid": self.pid, "since": self.since,
                "restarts": self.restarts,
                "last_exit": None if self.last_exit is None else self.last_exit._asdict(),
                "daemon_pid": self.daemon_pid}


def write(paths: Paths, record: Record) -> None:
    """Record the workload; DiskError if the run dir cannot take it (the daemon logs it)."""
    files.atomic_write(paths.workload_file, json.dumps(record.to_json()).encode() + b"\n", 0o644)


def _pid(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def read(path: Path) -> Record | None:
    """The record in `path`; None when it is missing or not one (a reader never fails on it)."""
    try:
        data = json.loads(files.read_regular(path, MAX_BYTES))
        last = data["last_exit"]
        record = Record(str(data["version"]), tuple(str(a) for a in data["command"]),
                        str(data["user"]), data["running"] is True, _pid(data["pid"]),
                        data["since"] if isinstance(data["since"], str) else None,
                        int(data["restarts"]),
                        None if last is None else Exit(last["code"], last["signal"],
                                                       str(last["time"])),
                        _pid(data["daemon_pid"]) or 0)
    except (OSError, ValueError, KeyError, TypeError, AgentFsmError):
        return None
    return record


def alive(pid: int | None) -> bool:
    if pid is None or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, another user's
        return True
    return True


def _writable(paths: Paths) -> dict[str, Any]:
    """The configured `writable_paths` and whether the agent unit on disk grants them. They are unit
    settings: they take effect once the unit is written and started again."""
    from ..assets.render import workload_lines  # here: only when a workload is declared

    wanted = [str(p) for p in paths.config.workload.writable_paths]
    try:
        lines = workload_lines(paths).splitlines()
    except ValueError:
        lines = []
    on_disk = (files.read_bytes(paths.agent_unit) or b"").decode("utf-8", "replace").splitlines()
    grant = [line for line in lines if line.startswith("ReadWritePaths=")]
    return {"configured": wanted, "in_unit": all(line in on_disk for line in grant)}


def view(paths: Paths, selected: str | None, user: str) -> dict[str, Any] | None:
    """`status --json`'s `workload`: null when the selected release declares none. Else the record,
    with `running` only while its process and daemon both live, `user` (who it would run as, when
    not running) and `writable_paths` (`_writable`)."""
    found = _view(paths, selected, user)
    return None if found is None else {**found, "writable_paths": _writable(paths)}


def _view(paths: Paths, selected: str | None, user: str) -> dict[str, Any] | None:
    if selected is None:
        return None
    try:
        command = read_manifest(paths.selected / "release.toml").workload
    except (OSError, ReleaseError):
        command = ()
    record = read(paths.workload_file)
    if not command and record is None:
        return None
    if record is None or record.version != selected:
        return {"command": list(command), "running": False, "pid": None, "since": None,
                "restarts": 0, "last_exit": None, "user": user}
    running = record.running and alive(record.pid) and alive(record.daemon_pid)
    return {"command": list(record.command), "running": running,
            "pid": record.pid if running else None, "since": record.since if running else None,
            "restarts": record.restarts,
            "last_exit": None if record.last_exit is None else record.last_exit._asdict(),
            "user": record.user}
