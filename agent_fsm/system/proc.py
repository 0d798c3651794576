"""Running a command: one place that starts a process, waits for it and keeps its last line.

Every command gets `environment.child_environment`: agent-fsm's own, less systemd's notify and
watchdog variables.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import CouldNotRun as CouldNotRun  # raised by run(); callers catch it here
from .environment import child_environment


@dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str

    @property
    def tail(self) -> str:
        """What the command said last: the last line of stderr, or of stdout when stderr is
        empty; "" when it said nothing."""
        return last_line(self.stderr or self.stdout)


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def run(argv: Sequence[str], *, timeout: float | None, stdin: str | None = None,
        env: Mapping[str, str] | None = None, cwd: Path | str | None = None,
        group: bool = False) -> Completed:
    """Run `argv` to completion and capture its output as text.

    `stdin` is sent as its input (without it the command inherits ours); `env` is added to our
    environment (`child_environment`). A non-zero exit is returned, not raised: what it means
    is the caller's call.
    `group`: run it in a process group of its own, all of which the timeout kills (a script's
    children too, which would otherwise hold its output open past the timeout).
    """
    if group:
        return _run_group(argv, timeout, stdin, child_environment(env), cwd)
    try:
        proc = subprocess.run(list(argv), input=stdin, capture_output=True, text=True,
                              timeout=timeout, cwd=cwd, check=False,
                              env=child_environment(env))
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CouldNotRun(argv, str(exc)) from None
    return Completed(proc.returncode, proc.stdout, proc.stderr)


def _run_group(argv: Sequence[str], timeout: float | None, stdin: str | None,
               env: Mapping[str, str] | None, cwd: Path | str | None) -> Completed:
    try:
        proc = subprocess.Popen(list(argv), stdin=None if stdin is None else subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=cwd, env=env, start_new_session=True)
    except OSError as exc:
        raise CouldNotRun(argv, str(exc)) from None
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=5)  # one that left the group may keep the pipes open
        proc.kill()
        proc.wait()
        raise CouldNotRun(argv, f"did not finish within {timeout:g}s (killed)") from None
    return Completed(proc.returncode, out, err)
