"""The host as the machine sees it: the conditions transitions check and the effects they run.

Every name in `states/agent-upgrade.toml` resolves here: `@condition` and `@effect` register the
methods of `Host` under their names in the tables of `upgrade.registry`, which the engine is
given and the definition is checked against. A condition answers: None when
it holds, else the error that refuses the transition (saying why). Each effect is idempotent (a
crash after it and before its progress is recorded runs it again) and works through small
injected objects: files below the configured paths, systemd, a publisher and a clock.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..errors import AgentFsmError, Refused, ReleaseError, SignalError
from ..machine.engine import Step
from ..machine.vocabulary import StateName
from ..node.assets import kept as kept_assets
from ..node.assets import render as assets
from ..node.paths import Paths
from ..node.records import hold
from ..node.records.reasons import CLASSES, one_line
from ..node.releases.pointers import Releases
from ..node.runtime import inhibitors, signal
from ..node.runtime.gate import Gate
from ..node.state.store import Upgrade
from ..system.clock import Clock
from ..system.publish import Outcome, Publisher, Result
from ..system.systemd import Systemd
from .registry import condition, effect

log = logging.getLogger("agent_fsm")


class Host:
    def __init__(self, paths: Paths, systemd: Systemd, publisher: Publisher,
                 clock: Clock) -> None:
        self.paths = paths
        self.systemd = systemd
        self.publisher = publisher
        self.clock = clock
        self.releases = Releases(paths)
        self.gate = Gate(paths.gate_file)

    # Helpers ------------------------------------------------------------------------------
    def signal(self) -> signal.UpgradeSignal | None:
        return signal.read(self.paths.signal_file)

    def rendered(self, version: str | None = None) -> tuple[assets.Asset, ...]:
        """The assets the given (default: selected) release would write for this host."""
        version = version or self.releases.selected()
        if version is None:
            raise ReleaseError("no release is selected; install one with `agent-fsm install`")
        self.releases.manifest(version)
        return assets.render(self.releases.path(version), self.paths, version)

    def asset_paths(self) -> tuple[Path, Path, Path]:
        p = self.paths
        return (p.agent_unit, p.recovery_unit, p.recovery_script)

    def _upgrade(self, step: Step) -> Upgrade:
        if step.doc.upgrade is not None:
            return step.doc.upgrade
        sig = self.signal()
        if sig is None:
            raise ReleaseError("no upgrade is pending: the state file and the signal disagree; "
                               "run `agent-fsm doctor`")
        return Upgrade(sig.from_version, sig.to_version, sig.started)

    def prepare(self, args: dict[str, Any]) -> dict[str, Any]:
        """Fix, before a transition is recorded, every value its effects will need.

        Effects read these instead of the clock or the disk, so one re-run after a crash does
        exactly what the first run would have done.
        """
        out = dict(args)
        out.setdefault("started", self.clock.now())
        out.setdefault("from", self.releases.last_good() or self.releases.selected())
        try:
            sig = self.signal()
        except SignalError:  # the way back must not need it; what does need it reports it
            sig = None
        if sig is not None:
            out.setdefault("attempt", sig.attempt + 1)
        return out

    # Conditions: None when they hold, else the error that refuses, saying why ------------
    @condition
    def gate_open(self, step: Step) -> AgentFsmError | None:
        if self.gate.is_open():
            return None
        return Refused(
            f"the startup gate ({self.paths.gate_file}) is closed: {self.paths.name} has not "
            f"finished starting (state {step.doc.state}); wait until `agent-fsm status` "
            "shows the gate open"
        )

    @condition
    def no_upgrade_pending(self, step: Step) -> AgentFsmError | None:
        sig = self.signal()
        if sig is None:
            return None
        return Refused(
            f"an upgrade from {sig.from_version} to {sig.to_version} is pending (attempt "
            f"{sig.attempt}); wait for its judgment, or roll back with `agent-fsm recover`"
        )

    @condition
    def release_exists(self, step: Step) -> AgentFsmError | None:
        try:
            self.releases.manifest(str(step.arg("release")))
        except ReleaseError as exc:
            return exc
        return None

    @condition
    def upgrade_signalled(self, step: Step) -> AgentFsmError | None:
        if self.signal() is not None:
            return None
        return Refused("no upgrade signal exists; nothing to roll back")

    @condition
    def not_selected(self, step: Step) -> AgentFsmError | None:
        if self.releases.selected() != step.arg("release"):
            return None
        return Refused(f"release {step.arg('release')} is already selected; nothing to upgrade")

    @condition
    def last_good_selected(self, step: Step) -> AgentFsmError | None:
        selected, last_good = self.releases.selected(), self.releases.last_good()
        if selected == last_good:
            return None
        return Refused(
            f"recovery is not finished: {selected} is selected but the last-good is "
            f"{last_good}; run `agent-fsm recover`"
        )

    @condition
    def not_held(self, step: Step) -> AgentFsmError | None:  # `agent-fsm hold`, unless forced
        return hold.refusal(hold.read(self.paths.hold_file), self.clock.now(),
                            force=bool(step.arg("force")))

    @condition
    def not_inhibited(self, step: Step) -> AgentFsmError | None:  # workloads', unless forced
        return inhibitors.refusal(inhibitors.scan(self.paths.inhibitor_dir),
                                  force=bool(step.arg("force")))

    # Effects ------------------------------------------------------------------------------
    @effect
    def close_gate(self, step: Step) -> None:
        self.gate.close()

    @effect
    def open_gate(self, step: Step) -> None:
        if self.gate.open():
            log.info("startup gate open")
        else:
            log.warning("the gate stays closed: %s is not running (its run directory %s is "
                        "absent); its next start opens it", self.paths.agent_unit_name,
                        self.gate.path.parent)

    @effect
    def write_signal(self, step: Step) -> None:
        up = Upgrade(str(step.arg("from")), str(step.arg("release")), float(step.arg("started")))
        step.doc.upgrade = up
        deadline = up.started + self.paths.config.judgment.deadline_seconds
        signal.write(self.paths.signal_file,
                     signal.UpgradeSignal(up.from_version, up.to_version, 0, up.started, deadline))

    @effect
    def adopt_signal(self, step: Step) -> None:
        """Take the pending upgrade from the signal when the state file lost it."""
        step.doc.upgrade = self._upgrade(step)

    @effect
    def clear_signal(self, step: Step) -> None:
        signal.clear(self.paths.signal_file)
        step.doc.upgrade = None

    @effect
    def count_attempt(self, step: Step) -> None:
        sig = self.signal()
        attempt = step.arg("attempt")
        # The attempt was fixed when the transition was recorded, so a re-run counts once.
        if sig is None or attempt is None or sig.attempt == attempt:
            return
        deadline = self.clock.now() + self.paths.config.judgment.deadline_seconds
        signal.write(self.paths.signal_file,
                     signal.UpgradeSignal(sig.from_version, sig.to_version, int(attempt),
                                          sig.started, deadline))

    @effect
    def select_release(self, step: Step) -> None:
        self.releases.select(str(step.arg("release")))

    @effect
    def select_last_good(self, step: Step) -> None:
        last_good = self.releases.last_good()
        if last_good is None:
            raise ReleaseError("there is no last-good release to roll back to")
        self.releases.select(last_good)

    @effect
    def promote_last_good(self, step: Step) -> None:
        selected = self.releases.selected()
        if selected is None:
            raise ReleaseError("no release is selected, so none can be promoted to last-good")
        # Keep its rendered assets first, so holding them during the next upgrade needs no
        # release directory (a crash before the pointer moves re-runs both).
        failed = kept_assets.keep_release(self.paths, self.releases, selected)
        if failed is not None:
            log.error("release %s's assets cannot be kept for the way back: %s", selected, failed)
        self.releases.promote(selected)

    @effect
    def reset_start_limit(self, step: Step) -> None:
        self.systemd.reset_failed(self.paths.agent_unit_name)

    @effect
    def restart_unit(self, step: Step) -> None:
        if not step.arg("no_start"):
            self.systemd.restart(self.paths.agent_unit_name)

    @effect
    def enable_unit(self, step: Step) -> None:
        if not step.arg("no_start"):
            self.systemd.enable(self.paths.agent_unit_name)

    @effect
    def start_recovery(self, step: Step) -> None:
        self.systemd.start(self.paths.recovery_unit_name)

    def _result(self, step: Step) -> Result | None:
        """The result this transition reports, or None when it was reported already."""
        up, ok = self._upgrade(step), step.dest == StateName.converged
        outcome: Outcome = "ok" if ok else "rolled_back"
        last = step.doc.last_result
        if last and last.get("to") == up.to_version and last.get("started") == up.started \
                and last.get("outcome") == outcome:
            return None
        why = str(step.arg("reason_class") or ("passed" if ok else "unknown"))
        return Result(up.from_version, up.to_version, outcome, up.started, self.clock.now(),
                      one_line(str(step.arg("reason") or CLASSES["passed" if ok else "unknown"])),
                      why if why in CLASSES else "unknown")

    @effect
    def publish_result(self, step: Step) -> None:
        """Record the result and deliver it (and any older one queued) before going on."""
        result = self._result(step)
        if result is None:
            self.publisher.deliver()  # recorded by an earlier run; the delivery may be owed
            return
        self.publisher.publish(result)
        step.doc.last_result = result.to_json()

    @effect
    def record_result(self, step: Step) -> None:
        """Record the result locally, queued for delivery: the way back never waits on the
        publish command (the last-good's daemon delivers it)."""
        result = self._result(step)
        if result is None:
            return
        self.publisher.record(result)
        step.doc.last_result = result.to_json()



# The known-bad rule's condition and effects, and the assets' effects, register themselves in
# the same tables.
from . import assets as asset_effects  # noqa: E402,F401
from . import known_bad  # noqa: E402,F401
