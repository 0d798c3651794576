"""The release's workload, supervised inside the agent unit: started as `[workload]` says, recorded
in `<run_dir>/workload.json`, stopped, and its crash loop forgotten once over.

After convergence the workload is the agent: when it exits, the daemon exits with its status and
systemd restarts the unit (`Restart=on-failure`), never a rollback.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from pathlib import Path

from .. import untrusted
from ..errors import AgentFsmError
from ..node.assets.render import RELEASES_VIEW
from ..node.releases import workload as workload_command
from ..node.runtime import workload as workload_state
from ..node.state.reasons import MAX_REASON
from ..node.state.store import CRASH_LOOP_WINDOW
from ..system import workload as workload_proc
from ..system.notify import Notifier
from ..system.stderr_tail import StderrTail
from ..wiring import Node

log = logging.getLogger("agent_fsm")
STDERR = 2
STDERR_LINES = 5  # the workload's last lines on stderr a reason quotes


def release_env(version: str, release_dir: Path, payload_dir: Path) -> dict[str, str]:
    """The `AGENT_FSM_*` variables a release's checks and workload are given."""
    return {"AGENT_FSM_VERSION": version, "AGENT_FSM_RELEASE_DIR": str(release_dir),
            "AGENT_FSM_PAYLOAD_DIR": str(payload_dir)}


class Workload:
    """The workload of the release this daemon serves, and the unit's crash loop."""

    def __init__(self, node: Node, notifier: Notifier) -> None:
        self.node = node
        self.notifier = notifier
        self.process: subprocess.Popen[bytes] | None = None
        self.record: workload_state.Record | None = None  # <run_dir>/workload.json
        self.last_exit: workload_state.Exit | None = None
        self.stderr: StderrTail | None = None  # the running workload's stderr, forwarded
        self._restarts_asked = False
        self.restarts = 0  # systemd's automatic restarts before this start (after crashes)
        # Up this long after a start that followed crashes, the crash loop is over.
        self.stable_after = CRASH_LOOP_WINDOW

    def start(self, version: str) -> None:
        """Start the release's workload, if it declares one, as `[workload]` says, and record it in
        `<run_dir>/workload.json`. WorkloadError (or ReleaseError) if it cannot start."""
        argv = self.node.releases.manifest(version).workload
        if not argv:
            return
        node, settings = self.node, self.node.config.workload
        who = workload_proc.account(settings.user, settings.group,
                                    f"config {node.config.source or '(defaults)'}")
        release_dir = node.releases.path(version)
        payload = release_dir / "payload"
        cwd = payload if payload.is_dir() else release_dir
        view = node.paths.real(node.config.run_dir) / RELEASES_VIEW / version
        if who.change and (view / "release.toml").is_file():
            # Another user cannot pass the 0700 state dir: it sees the releases read-only below the
            # run dir (the unit's BindReadOnlyPaths=).
            release_dir, payload, cwd = view, view / "payload", view / cwd.relative_to(release_dir)
        elif who.change:
            log.warning("the agent unit running now binds no view of the releases at %s (its "
                        "assets were written by an agent-fsm before it): %s cannot reach %s",
                        view.parent, who.words(), release_dir)
        command = workload_command.expand(argv, release_dir=str(release_dir),
                                          payload_dir=str(payload), version=version)
        env = workload_proc.environment(who, release_env(version, release_dir, payload),
                                        settings.environment)
        identifier = settings.identifier or node.paths.name
        stream = workload_proc.journal_stream(identifier)
        if stream is None:
            log.info("journald's stream socket %s is not there: the workload's output goes "
                     "where agent-fsm's does", workload_proc.JOURNAL_STDOUT)
        log.info("starting workload of %s as %s in %s (journal identifier %s): %s", version,
                 who.words(), cwd, identifier if stream else "agent-fsm's", " ".join(command))
        if not self._restarts_asked:
            self.ask_restarts()
        errors, errors_in = os.pipe()
        try:
            self.process = workload_proc.start(
                command, cwd=cwd, env=env, who=who, output=stream, errors=errors_in,
                read_only=self.kept_from_workload(), unconfined=log.warning)
            self.stderr = StderrTail(errors, stream.fileno() if stream else STDERR,
                                     STDERR_LINES, untrusted.MAX_SHOWN)
        except BaseException:
            os.close(errors)
            raise
        finally:
            os.close(errors_in)  # the workload holds its own copy
            if stream is not None:
                stream.close()
        self.record = workload_state.Record(
            version, command, who.name, True, self.process.pid,
            workload_state.iso(time.time()), self.restarts, self.last_exit, os.getpid())
        self._write_record()

    def kept_from_workload(self) -> tuple[Path, ...]:
        """What the workload sees read-only, whatever its user: agent-fsm's state, lib, unit and run
        directories, below `--root`. A `writable_paths` entry inside one stays read-only."""
        paths, config = self.node.paths, self.node.config
        return tuple(paths.real(d) for d in (config.state_dir, config.lib_dir, config.unit_dir,
                                             config.run_dir))

    def _write_record(self) -> None:
        if self.record is None:
            return
        try:
            workload_state.write(self.node.paths, self.record)
        except AgentFsmError as exc:  # status then shows what it can check: not running
            log.warning("could not record the workload in %s: %s",
                        self.node.paths.workload_file, exc)

    def exited(self) -> workload_state.Exit | None:
        """The workload's exit, recorded once it is seen; None while it runs (or if none)."""
        if self.process is None or self.process.poll() is None:
            return None
        if self.record is not None and self.record.running:
            self.last_exit = workload_state.Exit.of(self.process.returncode, time.time())
            self.record = self.record._replace(running=False, last_exit=self.last_exit)
            self._write_record()
        return self.last_exit

    def exit_reason(self, when: str) -> str:
        """A judgment's reason when the workload exited `when` ("while being judged"): its exit
        status or signal, and as many of its newest stderr lines, quoted, as a recorded reason
        holds."""
        exit_ = self.exited()
        words = exit_.words() if exit_ else "exited"
        head = f"the workload {'was ' if exit_ and exit_.signal else ''}{words} {when}"
        lines = self.stderr.last_lines() if self.stderr is not None else []
        intro = "; its last lines on stderr: "
        while lines:
            tail = ", ".join(untrusted.quoted(line) for line in lines)
            if len(head) + len(intro) + len(tail) <= MAX_REASON:
                return head + intro + tail
            if len(lines) == 1:
                room = MAX_REASON - len(head) - len(intro) - 2
                return head + intro + untrusted.quoted(lines[0], room)
            lines = lines[1:]
        return head

    def alive(self) -> bool:
        return self.process is None or self.exited() is None

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            self.exited()
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.exited()

    def serving_status(self, version: str | None) -> str:
        """The unit's STATUS= once the gate is open: whether the workload runs, never more."""
        head = f"{self.node.paths.name} {version}: gate open"
        if self.process is None:
            return f"{head}; no workload"
        exit_ = self.exited()
        if exit_ is not None:
            return f"{head}; workload {exit_.words()}"
        return f"{head}; workload running (pid {self.process.pid})"

    def died(self, version: str | None, code: int) -> int:
        """The daemon's exit code when the workload exited after convergence: its status (1 for a
        signal), so systemd restarts the unit (`Restart=on-failure`); never a rollback. STATUS= says
        so first, so `systemctl status` never shows it running meanwhile."""
        exit_ = self.exited() or workload_state.Exit.of(code, time.time())
        log.error("workload of %s %s; exiting so that systemd restarts %s", version,
                  exit_.words(), self.node.paths.agent_unit_name)
        self.notifier.status(f"{self.node.paths.name} {version}: workload {exit_.words()}; "
                             "restarting the unit")
        return code if code > 0 else 1

    def ask_restarts(self) -> int:
        """`automatic_restarts`, kept as this start's count."""
        self.restarts, self._restarts_asked = self.automatic_restarts(), True
        return self.restarts

    def automatic_restarts(self) -> int:
        """systemd's restarts of the agent unit after failures since its last start by hand
        (`NRestarts`; 0 when unknown). Above 0, this start follows a crash, and the history counts
        it in the crash loop's one entry."""
        unit = self.node.paths.agent_unit_name
        try:
            shown = self.node.effectors.systemd.show(unit, ("NRestarts",))
        except AgentFsmError as exc:
            log.info("could not ask systemd how often %s was restarted: %s", unit, exc)
            return 0
        value = shown.get("NRestarts", "")
        return int(value) if value.isdigit() else 0

    def forget_crashes(self) -> None:
        """Up `stable_after` seconds after a start that followed crashes, the loop is over: reset
        systemd's restart count (`reset-failed`), so the next crash waits `RestartSec=`, not the
        loop's longest delay (`RestartSteps=`, systemd 254+). A refused reset is only logged."""
        unit = self.node.paths.agent_unit_name
        try:
            self.node.effectors.systemd.reset_failed(unit)
        except AgentFsmError as exc:
            log.warning("up %.0fs after %d restart(s), could not reset %s's restart count: %s",
                        self.stable_after, self.restarts, unit, exc)
            return
        log.info("up %.0fs after %d restart(s): the crash loop is over; %s's restart count "
                 "reset", self.stable_after, self.restarts, unit)
