"""systemd, behind a small interface: the one thing the unit tests fake."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Protocol

from ..errors import SystemdError
from . import proc
from .unit_state import blocks

# What systemctl prints, exiting 0, when it believes it runs in a chroot (its root is not PID 1's)
# or offline ($SYSTEMD_OFFLINE=1): it then ignores start, restart, daemon-reload...
CHROOT_NOTICE = "Running in chroot, ignoring command"
SHOW_TIMEOUT = 10.0  # seconds `show` may take: the rollback goes on without its answer


class Systemd(Protocol):
    def daemon_reload(self) -> None: ...

    def reset_failed(self, unit: str) -> None: ...

    def restart(self, unit: str) -> None: ...

    def start(self, unit: str) -> None: ...

    def enable(self, unit: str) -> None: ...

    def disable(self, unit: str) -> None: ...

    def show(self, unit: str, properties: Sequence[str]) -> dict[str, str]: ...

    def reload_needed(self, units: Sequence[str]) -> bool: ...

    def version(self) -> int: ...


class Systemctl:
    """The real thing: `systemctl` in a subprocess.

    `prefix` starts every call (the config's `systemctl`; a container's agent may reach its host's
    systemd through a wrapper); a single string is one program. Starts and restarts use --no-block:
    the caller may be the unit's own process, which must not wait for its own stop. A unit name
    always follows `--`, so none can be read as an option.
    """

    def __init__(self, prefix: str | Sequence[str] = ("systemctl",), timeout: float = 60.0) -> None:
        self.prefix = (prefix,) if isinstance(prefix, str) else tuple(prefix)
        if not self.prefix:
            raise ValueError("the systemctl prefix is empty: it needs at least the program")
        self.timeout = timeout

    def _run(self, *args: str, timeout: float | None = None) -> proc.Completed:
        argv = [*self.prefix, *args]
        command = shlex.join(argv)
        try:
            done = proc.run(argv, timeout=timeout or self.timeout)
        except proc.CouldNotRun as exc:
            raise SystemdError(f"`{command}` could not run: {exc.reason}") from None
        if done.returncode != 0:
            raise SystemdError(f"`{command}` exited {done.returncode}: {done.tail or 'no output'}")
        if CHROOT_NOTICE in done.stderr:  # exit 0, and nothing was done
            raise SystemdError(
                f"`{command}` did nothing: systemctl says \"{done.tail}\" (its root is not PID "
                "1's, as in a container sharing the host's PID namespace); run the container "
                "without --pid=host, or set `systemctl = [\"env\", \"SYSTEMD_IGNORE_CHROOT=1\", "
                "\"systemctl\"]` in the config")
        return done

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

    def disable(self, unit: str) -> None:
        """Stop the unit and disable it (`disable --now`)."""
        self._run("disable", "--now", "--", unit)

    def show(self, unit: str, properties: Sequence[str]) -> dict[str, str]:
        """The unit's properties as `systemctl show` prints them (NAME=VALUE a line), with a short
        timeout of its own: the way back asks it."""
        done = self._run("show", f"--property={','.join(properties)}", "--", unit,
                         timeout=min(self.timeout, SHOW_TIMEOUT))
        found = blocks(done.stdout)
        return found[0] if found else {}

    def reload_needed(self, units: Sequence[str]) -> bool:
        """Whether systemd's view of `units` may differ from their files: False only when each is
        loaded and systemd says its file did not change (`NeedDaemonReload=no`). One `systemctl
        show` for all, where a `daemon-reload` re-reads every unit of the host and re-runs its
        generators."""
        done = self._run("show", "--property=Id,LoadState,NeedDaemonReload", "--", *units,
                         timeout=min(self.timeout, SHOW_TIMEOUT))
        fresh = {b.get("Id") for b in blocks(done.stdout)
                 if b.get("LoadState") == "loaded" and b.get("NeedDaemonReload") == "no"}
        return not set(units) <= fresh

    def version(self) -> int:
        """systemd's version, from `systemctl --version` ("systemd 252 (252.36-1~deb12u1)")."""
        done = self._run("--version", timeout=min(self.timeout, SHOW_TIMEOUT))
        words = done.stdout.split()
        if len(words) < 2 or words[0] != "systemd" or not words[1].isdigit():
            first = done.stdout.splitlines()[0] if done.stdout else "nothing"
            raise SystemdError(f"`{shlex.join([*self.prefix, '--version'])}` printed {first!r}, "
                               "expected `systemd N …`")
        return int(words[1])
