"""What the upgrade's conditions and effects act through: `Effectors`.

One object per node: its paths, releases and gate, and the injected objects that cross a process
boundary (systemd, a publisher, a clock). `prepare` fixes a transition's arguments.
"""

from __future__ import annotations

from typing import Any

from ..errors import AgentFsmError, ReleaseError, SignalError
from ..machine.engine import Step
from ..node.assets import render as assets
from ..node.paths import Paths
from ..node.releases.pointers import Releases
from ..node.runtime import signal
from ..node.runtime.gate import Gate
from ..node.state.store import Upgrade
from ..system.clock import Clock
from ..system.publish import Publisher
from ..system.systemd import Systemd


class Effectors:
    def __init__(self, paths: Paths, systemd: Systemd, publisher: Publisher,
                 clock: Clock) -> None:
        self.paths = paths
        self.systemd = systemd
        self.publisher = publisher
        self.clock = clock
        self.releases = Releases(paths)
        self.gate = Gate(paths.gate_file)

    def signal(self) -> signal.UpgradeSignal | None:
        return signal.read(self.paths.signal_file)

    def systemd_version(self) -> int | None:
        """The host's systemd version, asked once a boot; None when unknown (rendered as the oldest)."""
        known = assets.systemd_version(self.paths)
        if known is not None:
            return known
        try:
            asked = self.systemd.version()
            assets.remember_systemd_version(self.paths, asked)
        except (AgentFsmError, OSError) as exc:
            import logging

            logging.getLogger("agent_fsm").warning(
                "could not ask or keep systemd's version (%s): rendering the agent unit for the "
                "oldest systemd; the next start asks again", exc)
            return None
        return asked

    def rendered(self, version: str | None = None) -> tuple[assets.Asset, ...]:
        """The assets the given (default: selected) release would write for this node and its systemd."""
        self.systemd_version()
        version = version or self.releases.selected()
        if version is None:
            raise ReleaseError("no release is selected; install one with `agent-fsm install`")
        self.releases.manifest(version)
        return assets.render(self.releases.path(version), self.paths, version)

    def pending_upgrade(self, step: Step) -> Upgrade:
        """The upgrade this transition is about: the state file's, else the signal's."""
        if step.doc.upgrade is not None:
            return step.doc.upgrade
        sig = self.signal()
        if sig is None:
            raise ReleaseError("no upgrade is pending: the state file and the signal disagree; "
                               "run `agent-fsm doctor`")
        return Upgrade(sig.from_version, sig.to_version, sig.started)

    def prepare(self, args: dict[str, Any]) -> dict[str, Any]:
        """Fix, before a transition is recorded, every value its effects will need.

        Effects read these, not the clock or the disk, so a re-run after a crash does the same.
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
