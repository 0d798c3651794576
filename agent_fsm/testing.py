"""Fakes for tests of agent-fsm and of the tools built on it: only what crosses a process
boundary (systemctl, a publish command) and time. Everything else is real and runs on files.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .errors import PublishError, SystemdError
from .system.publish import Result


@dataclass
class FakeClock:
    """A clock that moves only when slept on or advanced; `step` moves the wall clock alone
    (`now`), as NTP does, never `monotonic`."""

    t: float = 1_700_000_000.0
    sleeps: list[float] = field(default_factory=list)
    mono: float = 1_000.0

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.mono

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds
        self.mono += seconds

    def advance(self, seconds: float) -> None:
        self.t += seconds
        self.mono += seconds

    def step(self, seconds: float) -> None:
        self.t += seconds


@dataclass
class FakeSystemd:
    """Records systemctl calls as (verb, unit) in `calls`.

    `fail` names verbs that raise SystemdError; `on_call` runs on each call, before it is
    recorded, to observe the host at that moment.
    """

    calls: list[tuple[str, str]] = field(default_factory=list)
    fail: set[str] = field(default_factory=set)
    on_call: Callable[[str, str], None] | None = None
    shown: dict[str, str] = field(default_factory=dict)  # what `show` answers
    shown_for: dict[str, dict[str, str]] = field(default_factory=dict)  # ... for these units
    loaded_fresh: bool = False  # what `reload_needed` answers: not needed (True), or needed
    systemd_version: int = 252  # what `version` answers (asked: `versions_asked`, not `calls`)
    versions_asked: int = 0

    def _call(self, verb: str, unit: str = "") -> None:
        if self.on_call is not None:
            self.on_call(verb, unit)
        if verb in self.fail:
            raise SystemdError(f"`systemctl {verb} {unit}` exited 1: injected failure")
        self.calls.append((verb, unit))

    def daemon_reload(self) -> None:
        self._call("daemon-reload")

    def reset_failed(self, unit: str) -> None:
        self._call("reset-failed", unit)

    def restart(self, unit: str) -> None:
        self._call("restart", unit)

    def start(self, unit: str) -> None:
        self._call("start", unit)

    def enable(self, unit: str) -> None:
        self._call("enable", unit)

    def disable(self, unit: str) -> None:
        self._call("disable", unit)

    def show(self, unit: str, properties: Sequence[str]) -> dict[str, str]:
        self._call("show", unit)
        answer = self.shown_for.get(unit, self.shown)
        return {k: v for k, v in answer.items() if k in properties}

    def reload_needed(self, units: Sequence[str]) -> bool:
        self._call("show", " ".join(units))
        return not self.loaded_fresh

    def version(self) -> int:
        self.versions_asked += 1
        if "version" in self.fail:
            raise SystemdError("`systemctl --version` exited 1: injected failure")
        return self.systemd_version


@dataclass
class FakePublisher:
    """Records results in `recorded` and queues them; delivering moves them to `published`,
    failing the first `failures` delivery attempts. `on_publish` observes each attempt."""

    failures: int = 0
    recorded: list[Result] = field(default_factory=list)
    published: list[Result] = field(default_factory=list)
    queue: list[Result] = field(default_factory=list)
    attempts: int = 0
    on_publish: Callable[[Result], None] | None = None

    def record(self, result: Result) -> None:
        """As `RecordPublisher` does: one record per upgrade and outcome, a later one
        replacing it (and its queued copy, if not yet delivered)."""
        key = (result.to_version, result.started, result.outcome)

        def same(r: Result) -> bool:
            return (r.to_version, r.started, r.outcome) == key

        if not any(same(r) for r in self.recorded):
            self.recorded.append(result)
            self.queue.append(result)
            return
        self.recorded = [result if same(r) else r for r in self.recorded]
        self.queue = [result if same(r) else r for r in self.queue]

    def deliver(self) -> int:
        delivered = 0
        while self.queue:
            result = self.queue[0]
            self.attempts += 1
            if self.on_publish is not None:
                self.on_publish(result)
            if self.failures > 0:
                self.failures -= 1
                raise PublishError("publish command fake exited 1: injected failure")
            self.published.append(self.queue.pop(0))
            delivered += 1
        return delivered

    def publish(self, result: Result) -> None:
        self.record(result)
        self.deliver()
