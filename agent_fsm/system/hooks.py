"""Running the host's hooks: each a command given the transition as JSON on stdin and as
`AGENT_FSM_*` variables, in its own process group, which its timeout kills.

A `before` hook runs in the caller and answers whether the transition may go on. `after` hooks run
one at a time, in order, on a worker thread, delaying nothing (READY=1, the way back); a process
waits for its queued ones before it exits. A failing `after` hook is logged, not raised.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import AgentFsmError
from . import proc

log = logging.getLogger("agent_fsm")


def environment(transition: Mapping[str, Any]) -> dict[str, str]:
    """`AGENT_FSM_<KEY>` for each scalar of the transition ("" for null)."""
    return {f"AGENT_FSM_{key.upper()}": "" if value is None else str(value)
            for key, value in transition.items()
            if value is None or isinstance(value, str | int | float)}


class HookRunner:
    """The hooks of one node: argv by trigger, before and after, and the timeout of each."""

    def __init__(self, name: str, before: Mapping[str, Sequence[str]],
                 after: Mapping[str, Sequence[str]], timeout: float,
                 noted: Callable[[str, str | None], None] | None = None) -> None:
        """`noted(key, failure)` is told how each `after` hook ended ("after.<trigger>", and what
        failed or None), to keep it where `status` reads it."""
        self.name = name
        self.before_hooks = dict(before)
        self.after_hooks = dict(after)
        self.timeout = timeout
        self._queue: deque[dict[str, Any]] = deque()
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self.failures: list[str] = []  # what failed after a transition, in this process
        self.noted = noted

    def has_before(self, trigger: str) -> bool:
        return trigger in self.before_hooks

    def before(self, transition: Mapping[str, Any]) -> str | None:
        argv = self.before_hooks.get(transition["trigger"])
        return None if argv is None else self._run(argv, transition)

    def after(self, transition: Mapping[str, Any]) -> None:
        if transition["trigger"] not in self.after_hooks:
            return
        with self._lock:
            self._queue.append(dict(transition))
            if self._worker is None:
                # Not a daemon thread: the interpreter waits for it before it exits.
                self._worker = threading.Thread(target=self._drain, name="agent-fsm-after-hooks")
                self._worker.start()

    def wait(self, timeout: float | None = None) -> None:
        """Wait until the queued `after` hooks have run (tests; an orderly exit)."""
        worker = self._worker
        if worker is not None:
            worker.join(timeout)

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._worker = None
                    return
                transition = self._queue.popleft()
            failed = self._run(self.after_hooks[transition["trigger"]], transition)
            if failed is not None:
                self.failures.append(failed)
                log.error("%s (not fatal: %s is recorded and goes on)", failed,
                          transition["trigger"])
            if self.noted is not None:
                try:
                    self.noted(f"after.{transition['trigger']}", failed)
                except (OSError, AgentFsmError) as exc:
                    log.warning("could not record how hook after.%s ended: %s",
                                transition["trigger"], exc)

    def _run(self, argv: Sequence[str], transition: Mapping[str, Any]) -> str | None:
        """None when the hook exits 0; else what went wrong, with its last line of output."""
        data = {"name": self.name, **transition}
        which = f"hook {data['hook']}.{data['trigger']} ({argv[0]})"
        try:
            done = proc.run(argv, timeout=self.timeout, stdin=json.dumps(data),
                            env=environment(data), cwd="/", group=True)
        except proc.CouldNotRun as exc:
            return f"{which} could not run: {exc.reason}"
        if done.returncode != 0:
            return f"{which} exited {done.returncode}: {done.tail or 'no output'}"
        return None
