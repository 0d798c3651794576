"""systemd, behind a small interface: the one thing the unit tests fake."""

from __future__ import annotations

from typing import Protocol

from ..errors import SystemdError
from . import proc


class Systemd(Protocol):
    def daemon_reload(self) -> None: ...

    def reset_failed(self, unit: str) -> None: ...

    def restart(self, unit: str) -> None: ...

    def start(self, unit: str) -> None: ...

    def enable(self, unit: str) -> None: ...


class Systemctl:
    """The real thing: `systemctl` in a subprocess.

    Restarts and starts are queued with --no-block: the caller may be the unit's own process,
    which must not wait for its own stop. A unit name always follows `--`, so that no name,
    whatever the config says, can be read as an option.
    """

    def __init__(self, executable: str = "systemctl", timeout: float = 60.0) -> None:
        self.executable = executable
        self.timeout = timeout

    def _run(self, *args: str) -> None:
        command = " ".join([self.executable, *args])
        try:
            done = proc.run([self.executable, *args], timeout=self.timeout)
        except proc.CouldNotRun as exc:
            raise SystemdError(f"`{command}` could not run: {exc.reason}") from None
        if done.returncode != 0:
            raise SystemdError(f"`{command}` exited {done.returncode}: {done.tail or 'no output'}")

    def daemon_reload(self) -> None:
        self._run("daemon-reload")

    def reset_failed(self, unit: str) -> None:
        self._run("reset-failed", "--", unit)

    def restart(self, unit: str) -> None:
        self._run("restart", "--no-block", "--", unit)

    def start(self, unit: str) -> None:
        self._run("start", "--no-block", "--", unit)

    def enable(self, unit: str) -> None:
        self._run("enable", "--", unit)
