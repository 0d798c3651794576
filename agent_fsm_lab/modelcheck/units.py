"""systemd as a small explicit model: the agent unit and the recovery unit, their start counts,
restart policy and `OnFailure=`, and what the processes asked of `systemctl`.

What the model keeps of each unit is what the upgrade's rules depend on:

- the agent unit is `inactive`, `activating` (a start is queued: a restart job, an automatic
  restart, a boot), `exec:R` (its `ExecStartPre=` let the start go on and `ExecStart=` resolved
  the `selected` link to release R: that process runs R's code), `stopping:R` (that process was
  sent SIGTERM by a restart of the unit while starting, and runs on until it notices; the
  restart's start follows), `active:R` or `failed`;
- the recovery unit is `inactive` or `activating` (a oneshot: started, or restarted after a
  failed `recover`, with `Restart=on-failure` and no start limit);
- whether the agent unit is enabled (`systemctl enable`; as the first install left it): a boot
  starts it only then;
- which agent unit file systemd has loaded (`loaded`: its version and digest, `unit_label`):
  the file on disk at the last `daemon-reload` (at the moment of the call) or boot. systemd runs
  the unit it loaded, not the file on disk, and answers `NeedDaemonReload=` from the two;
- the agent unit's start count against its start limit (read from the unit file loaded; the
  unit agent-fsm writes has none, one held from an older release has
  `StartLimitBurst=max_attempts`), and `NRestarts` of both units;
- the start limit as systemd applies it (systemd.unit(5), `StartLimitIntervalSec=`): every
  start counts, an automatic restart, a `systemctl start`/`restart` job (queued `--no-block`:
  the call returns 0, the refusal comes when the job runs, at once where no process has to
  stop first, so before the caller's next `systemctl`) or a boot's; the start after
  `StartLimitBurst` of them is refused, and the unit enters `failed` with result
  `start-limit-hit` and stays there (`Restart=` no longer applies) until something starts it
  again after a `reset-failed`, which flushes the count. Every start on one path is taken as
  within the interval (300 s: the worst case; a candidate's starts take seconds each); a boot
  starts a new count;
- `OnFailure=` with both of systemd's semantics: entering `failed` starts the recovery unit on
  every version (up to 254 a unit with `Restart=` enters it only at its start limit), and from
  255 on so does every failure followed by an automatic restart; and what a `daemon-reload`
  does to the start count: reset up to 254, kept from 255 on. `reset-failed` zeroes both
  counts.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agent_fsm.errors import SystemdError

RESTARTS_CAP = 2  # NRestarts above this behaves as this (the retry delay is capped anyway)


@dataclass(frozen=True)
class Units:
    systemd: int = 252
    agent: str = "active"  # see the module's docstring; "active:R" once known
    recovery: str = "inactive"
    starts: int = 0  # the agent unit's starts against its start limit
    limit: int | None = None  # StartLimitBurst of the loaded agent unit; None: no limit
    agent_restarts: int = 0  # NRestarts
    recovery_restarts: int = 0
    loaded: str | None = None  # `unit_label` of the agent unit file systemd loaded
    enabled: bool = True  # the agent unit is enabled (`systemctl enable`): a boot starts it

    @property
    def running(self) -> str | None:
        """The release whose daemon runs in the agent unit (exec'd or active), if any."""
        for prefix in ("exec:", "stopping:", "active:"):
            if self.agent.startswith(prefix):
                return self.agent[len(prefix):]
        return None

    def start_agent(self) -> Units:
        return replace(self, agent="activating")

    def start_recovery(self) -> Units:
        return self if self.recovery == "activating" else replace(self, recovery="activating")

    def agent_failed(self) -> Units:
        """The agent unit's process failed (exit non-zero, killed, start timeout): `Restart=`
        queues its automatic restart (which the start limit may refuse: `start_refused`)."""
        up = replace(self, agent="activating",
                     agent_restarts=min(self.agent_restarts + 1, RESTARTS_CAP))
        return up.start_recovery() if self.systemd >= 255 else up

    @property
    def start_refused(self) -> bool:
        """The start just counted (`counted_start`) is past the start limit: systemd refuses
        it ("start request repeated too quickly")."""
        return self.limit is not None and self.starts > self.limit

    def start_limit_hit(self) -> Units:
        """The refused start: the unit enters `failed` (result `start-limit-hit`), which starts
        `OnFailure=` on every systemd; nothing restarts it."""
        return replace(self, agent="failed").start_recovery()

    def recovery_failed(self) -> Units:
        return replace(self, recovery="activating",
                       recovery_restarts=min(self.recovery_restarts + 1, RESTARTS_CAP))

    def counted_start(self) -> Units:
        cap = (self.limit or 0) + 1
        return replace(self, starts=min(self.starts + 1, cap))

    def boot(self, unit_file: bytes | None) -> Units:
        """Power back on (or a reboot): systemd loads the unit files on disk, the agent unit
        starts if it is enabled (a new start count), nothing else runs."""
        return Units(systemd=self.systemd, agent="activating" if self.enabled else "inactive",
                     limit=start_limit(unit_file), loaded=unit_label(unit_file),
                     enabled=self.enabled)

    def answer(self, unit: str, agent_unit: str) -> dict[str, str]:
        restarts = self.agent_restarts if unit == agent_unit else self.recovery_restarts
        # the agent unit enters `failed` only at its start limit (Restart= restarts it else)
        result = "start-limit-hit" if unit == agent_unit and self.agent == "failed" else "success"
        return {"NRestarts": str(restarts), "Result": result, "ExecMainStatus": "1",
                "ActiveState": self.agent.split(":")[0] if unit == agent_unit else self.recovery}

    def apply(self, calls: Sequence[tuple[str, str]], agent_unit: str, recovery_unit: str,
              unit_file: bytes | None) -> Units:
        """What systemd does with the calls a process made (in order)."""
        u = self
        for verb, unit in calls:
            if unit == agent_unit and verb == "restart" and u.agent.startswith("exec:"):
                # its process is starting: SIGTERM comes, but it runs on until it sees it
                u = replace(u, agent="stopping:" + u.agent[len("exec:"):])
            elif unit == agent_unit and (verb == "restart" or (verb == "start" and u.running is None)):
                # The job is queued (`--no-block`) and, with no process to stop first, runs at
                # once: past the start limit it is refused before the caller's next call.
                if u.running is None and u.limit is not None and u.starts >= u.limit:
                    u = u.counted_start().start_limit_hit()
                else:
                    u = u.start_agent()
            elif verb == "start" and unit == recovery_unit:
                u = u.start_recovery()
            elif verb == "reset-failed" and unit == agent_unit:
                u = replace(u, starts=0, agent_restarts=0,
                            agent="inactive" if u.agent == "failed" else u.agent)
            elif verb == "reset-failed" and unit == recovery_unit:
                u = replace(u, recovery_restarts=0)
            elif verb == "enable" and unit == agent_unit:
                u = replace(u, enabled=True)
            elif verb == "daemon-reload":
                # the file as it was at the call (`ModelSystemd` records its label there)
                label = None if unit == "none" else unit if unit else unit_label(unit_file)
                u = replace(u, loaded=label, limit=_LIMITS.get(label, start_limit(unit_file)),
                            starts=0 if u.systemd <= 254 else u.starts)
        return u

    def key(self) -> tuple[object, ...]:
        return (self.systemd, self.agent, self.recovery, self.starts, self.limit,
                self.agent_restarts, self.recovery_restarts, self.loaded, self.enabled)


# where `Units.key` holds what `mutants.observable` and `mutants.at_rest` leave out
KEY_STARTS, KEY_LIMIT, KEY_AGENT_RESTARTS = 3, 4, 5


_LIMITS: dict[str | None, int | None] = {None: None}  # each label's start limit


def unit_label(unit_file: bytes | None) -> str | None:
    """The agent unit file as the model names it: the release that wrote it (its first line)
    and a digest of its bytes; None when there is no file."""
    if unit_file is None:
        return None
    found = re.match(rb"# Written by agent-fsm (\S+?)\.?\s", unit_file)
    who = found.group(1).decode(errors="replace") if found else "?"
    label = f"{who}:{hashlib.sha256(unit_file).hexdigest()[:8]}"
    _LIMITS.setdefault(label, start_limit(unit_file))
    return label


def start_limit(unit_file: bytes | None) -> int | None:
    """The StartLimitBurst a unit file sets (systemd's default 5 within 10 s), None when its
    StartLimitIntervalSec= is 0 (no limit) or there is no file."""
    if unit_file is None:
        return None
    text = unit_file.decode(errors="replace")
    interval = re.findall(r"^StartLimitIntervalSec=(\S*)", text, re.M)
    if interval and interval[-1] in ("0", "infinity"):
        return None
    burst = re.findall(r"^StartLimitBurst=(\d+)", text, re.M)
    return int(burst[-1]) if burst else 5


@dataclass
class ModelSystemd:
    """What a process's `systemctl` calls reach: recorded for `Units.apply`, answered from the
    model; `fail` names the verbs that fail in this process (a failing or refusing systemctl).
    `on_restart_of_agent` runs when the agent unit is restarted (its process is then stopped)."""

    units: Units
    agent_unit: str
    fail: frozenset[str] = frozenset()
    calls: list[tuple[str, str]] = field(default_factory=list)
    used: set[str] = field(default_factory=set)
    on_restart_of_agent: list[object] = field(default_factory=list)
    stop: list[bool] = field(default_factory=list)  # set when this process's unit is stopped
    own_unit: str | None = None
    waker: Any = None  # the daemon's: a restart of its own unit stops it
    recovery_unit: str = ""  # for `show`, which answers after the calls made so far
    unit_file: Any = None  # () -> the agent unit file's bytes on disk (for a reload's limit)

    def _call(self, verb: str, unit: str = "") -> None:
        self.used.add(verb)
        if verb in self.fail:
            raise SystemdError(f"`systemctl {verb} {unit}` exited 1: injected by the model check")
        if verb == "daemon-reload":  # systemd loads the file as it is now
            unit = unit_label(self._on_disk()) or "none"
        self.calls.append((verb, unit))
        if verb == "restart" and unit == self.own_unit:
            self.stop.append(True)
            if self.waker is not None:
                self.waker.stop = True

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
        now = self.units.apply(self.calls, self.agent_unit, self.recovery_unit,
                               self.unit_file() if self.unit_file is not None else None)
        answer = now.answer(unit, self.agent_unit)
        return {k: v for k, v in answer.items() if k in properties}

    def _on_disk(self) -> bytes | None:
        return self.unit_file() if self.unit_file is not None else None

    def reload_needed(self, units: Sequence[str]) -> bool:
        """`NeedDaemonReload=` of the agent unit: its file on disk is not the one loaded (the
        recovery unit's is not modelled: it changes with the agent unit's, in one write)."""
        self._call("show", " ".join(units))
        now = self.units.apply(self.calls, self.agent_unit, self.recovery_unit, self._on_disk())
        return now.loaded != unit_label(self._on_disk())

    def version(self) -> int:
        return self.units.systemd
