"""What the units and the state dir say, for `status` and its next action.

The state file alone cannot tell a candidate being judged from one whose unit and recovery unit both
failed. Nor can it tell a rollback systemd will retry from one nothing retries. Read at every
`status`, bounded: one `systemctl show` for both units within `system.unit_state.READ_TIMEOUT`, the
journal only when something failed. When systemctl is missing, refuses or hangs, the units are
"unknown"; `status` says so and goes on.

The situations, most specific first (`advise`): writes to the state dir failing (read-only or full),
both units failed, a recovery retry pending, the recovery unit failed, the agent unit failed. Each
has its own line (`situation`) and next commands.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, NamedTuple

from ...system import unit_state
from .advice import NextAction, span

if TYPE_CHECKING:
    from ...node.state.store import StateDoc
    from ...wiring import Node, Reader


class UnitView(NamedTuple):
    """One unit as systemd sees it (`systemctl show`)."""

    unit: str
    active: str  # ActiveState: active, activating, failed, inactive...
    sub: str  # SubState: running, auto-restart, failed, dead...
    result: str  # Result: success, exit-code, timeout, start-limit-hit...
    restarts: int | None  # NRestarts
    exit_status: int | None  # ExecMainStatus
    next_try_in_seconds: float | None  # in auto-restart: when systemd starts it again

    @property
    def failed(self) -> bool:
        return self.active == "failed"

    @property
    def retrying(self) -> bool:
        return self.sub == "auto-restart"

    def words(self) -> str:
        """The unit in a few words: "failed (exit-code, exit status 1, restarted 2 times)"."""
        what = [self.result] if self.result and self.result != "success" else []
        if self.exit_status:
            what.append(f"exit status {self.exit_status}")
        if self.restarts:
            what.append(f"restarted {self.restarts} time{'s' if self.restarts != 1 else ''}")
        state = self.sub if self.retrying else self.active
        return state + (f" ({', '.join(what)})" if what else "")

    def to_json(self) -> dict[str, Any]:
        return {"unit": self.unit, "active": self.active, "sub": self.sub, "result": self.result,
                "restarts": self.restarts, "exit_status": self.exit_status,
                "next_try_in_seconds": self.next_try_in_seconds}


class Units(NamedTuple):
    """The agent and recovery units, the state dir's writability and the units' last error."""

    agent: UnitView | None
    recovery: UnitView | None
    error: str | None  # why the units are unknown ("`systemctl` could not run: ...")
    writes_error: str | None  # why a write to the state dir fails now (read-only, full)
    last_error: str | None  # the last line the units logged at error, when something failed

    def to_json(self) -> dict[str, Any]:
        return {"agent": None if self.agent is None else self.agent.to_json(),
                "recovery": None if self.recovery is None else self.recovery.to_json(),
                "error": self.error, "writes_error": self.writes_error,
                "last_error": self.last_error}


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def _view(unit: str, shown: dict[str, str], monotonic: float) -> UnitView:
    next_try = None
    if shown.get("SubState") == "auto-restart":
        delay = unit_state.seconds(shown.get("RestartUSecNext") or shown.get("RestartUSec", ""))
        since = _int(shown.get("StateChangeTimestampMonotonic"))
        if delay is not None and since:
            next_try = max(since / 1e6 + delay - monotonic, 0.0)
    return UnitView(unit, shown.get("ActiveState", "unknown"), shown.get("SubState", "unknown"),
                    shown.get("Result", ""), _int(shown.get("NRestarts")),
                    _int(shown.get("ExecMainStatus")), next_try)


def writes_error(state_dir: os.PathLike[str] | str) -> str | None:
    """Why a write to the state dir would fail now, from the file system's flags (no write is tried:
    `status` writes nothing): mounted read-only, or no block or inode left."""
    try:
        st = os.statvfs(state_dir)
    except OSError:
        return None  # a missing state dir is not installed yet, or doctor's business
    if st.f_flag & os.ST_RDONLY:
        return f"{state_dir} is on a read-only file system"
    if st.f_blocks and st.f_bfree == 0:
        return f"{state_dir} is on a full file system (no space left)"
    if st.f_files and st.f_ffree == 0:
        return f"{state_dir} is on a file system with no inodes left"
    return None


def read(node: Node | Reader) -> Units:
    """The units and the state dir as they are now; never raises for systemd's sake."""
    names = (node.paths.agent_unit_name, node.paths.recovery_unit_name)
    prefix = node.config.systemctl
    agent = recovery = None
    error = None
    try:
        shown = unit_state.show(prefix, names)
        now = time.monotonic()
        agent, recovery = (_view(n, shown[n], now) for n in names)
    except unit_state.Unread as exc:
        error = exc.reason
    writes = writes_error(node.paths.state_dir)
    troubled = writes is not None or any(u is not None and (u.failed or u.retrying)
                                         for u in (agent, recovery))
    last = unit_state.last_error(prefix, names) if troubled else None
    return Units(agent, recovery, error, writes, last)


class Advice(NamedTuple):
    """What the units change in `status`: the situation line and the next action."""

    kind: str  # write_failing, both_failed, recovery_retrying, recovery_failed, agent_failed
    situation: str
    next: NextAction


def advise(u: Units, node: Node | Reader, doc: StateDoc, prog: str) -> Advice | None:
    """The situation the units and the state dir put the node in, most specific first; None when
    they change nothing (all is well, or the units are unknown: `status` says so)."""
    agent, recovery = u.agent, u.recovery
    recover = f"{prog} recover"
    rjournal = f"journalctl -u {node.paths.recovery_unit_name} -n 50"
    ajournal = f"journalctl -u {node.paths.agent_unit_name} -n 50"
    last = f" (last error: {u.last_error})" if u.last_error else ""
    can_roll_back = doc.state in node.groups.recover_from
    if u.writes_error is not None:
        pending = doc.state in node.groups.pending
        return Advice("write_failing", f"writes to the state dir fail: {u.writes_error}{last}",
                      NextAction(
                          f"free space on or remount read-write {node.paths.state_dir}"
                          + ("; the way back goes on once it is writable" if pending else ""),
                          (f"df -h {node.paths.state_dir}", f"findmnt -T {node.paths.state_dir}",
                           ajournal)))
    if agent is None or recovery is None:
        return None
    if doc.state not in node.groups.pending:
        # No rollback is due: a recovery unit still `failed` from an earlier one (finished by hand)
        # is shown in the units' row, not advised on.
        recovery = recovery._replace(active="inactive", sub="dead")
    if agent.failed and recovery.failed:
        return Advice("both_failed",
                      f"{agent.unit} is {agent.words()} and {recovery.unit} is "
                      f"{recovery.words()}: the way back stopped and nothing retries it{last}",
                      NextAction("roll back now, then see why recovery failed" if can_roll_back
                                 else f"see why both failed, then start {agent.unit} again",
                                 ((recover,) if can_roll_back else
                                  (f"systemctl reset-failed {agent.unit}",
                                   f"systemctl start {agent.unit}")) + (rjournal,)))
    if recovery.retrying:
        when = ("" if recovery.next_try_in_seconds is None
                else f" in {span(recovery.next_try_in_seconds)}")
        return Advice("recovery_retrying",
                      f"the rollback failed and systemd retries {recovery.unit}{when} "
                      f"({recovery.words()}){last}",
                      NextAction(f"wait for the retry{when}; or roll back now", (recover, rjournal)))
    if recovery.failed:
        return Advice("recovery_failed",
                      f"{recovery.unit} is {recovery.words()}: the rollback did not finish{last}",
                      NextAction("roll back now, then see why recovery failed"
                                 if can_roll_back else f"see why {recovery.unit} failed",
                                 ((recover,) if can_roll_back else ()) + (rjournal,)))
    if agent.failed:
        if can_roll_back and recovery.active in ("inactive", "unknown"):
            return Advice("agent_failed",
                          f"{agent.unit} is {agent.words()} and {recovery.unit} has not "
                          f"rolled back{last}",
                          NextAction("roll back now", (recover, ajournal)))
        if can_roll_back:
            return None  # recovery is running: the state's own advice says to wait for it
        return Advice("agent_failed", f"{agent.unit} is {agent.words()}; systemd does not "
                      f"start it again by itself{last}",
                      NextAction(f"see why it failed, then start {agent.unit} again",
                                 (ajournal, f"systemctl reset-failed {agent.unit}",
                                  f"systemctl start {agent.unit}")))
    return None
