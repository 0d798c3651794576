"""The upgrade signal as the machine uses it (the file itself: `node.runtime.signal`).

It says whether an upgrade is pending (`no_upgrade_pending`, `upgrade_signalled`), is written
when one begins, counts the candidate's attempts, and is cleared when it ends. `adopt_signal`
takes the pending upgrade from it when the state file lost it.
"""

from __future__ import annotations

from ..errors import AgentFsmError, Refused
from ..machine.engine import Step
from ..node.runtime import signal
from ..node.state.store import Upgrade
from .effectors import Effectors


def no_upgrade_pending(effectors: Effectors, step: Step) -> AgentFsmError | None:
    sig = effectors.signal()
    if sig is None:
        return None
    return Refused(
        f"an upgrade from {sig.from_version} to {sig.to_version} is pending (attempt "
        f"{sig.attempt}); wait for its judgment, or roll back with `agent-fsm recover`"
    )


def upgrade_signalled(effectors: Effectors, step: Step) -> AgentFsmError | None:
    if effectors.signal() is not None:
        return None
    return Refused(f"no upgrade signal exists at {effectors.paths.signal_file}")


def write_signal(effectors: Effectors, step: Step) -> None:
    channel = step.arg("channel")  # `follow`'s: {name, index_version}
    up = Upgrade(str(step.arg("from")), str(step.arg("release")), float(step.arg("started")),
                 channel=channel if isinstance(channel, dict) else None)
    step.doc.upgrade = up
    deadline = up.started + effectors.paths.config.judgment.deadline_seconds
    signal.write(effectors.paths.signal_file,
                 signal.UpgradeSignal(up.from_version, up.to_version, 0, up.started, deadline))


def adopt_signal(effectors: Effectors, step: Step) -> None:
    """Take the pending upgrade from the signal when the state file lost it."""
    step.doc.upgrade = effectors.pending_upgrade(step)


def clear_signal(effectors: Effectors, step: Step) -> None:
    signal.clear(effectors.paths.signal_file)
    step.doc.upgrade = None


def count_attempt(effectors: Effectors, step: Step) -> None:
    sig = effectors.signal()
    attempt = step.arg("attempt")
    # The attempt was fixed when the transition was recorded, so a re-run counts once.
    if sig is None or attempt is None or sig.attempt == attempt:
        return
    deadline = effectors.clock.now() + effectors.paths.config.judgment.deadline_seconds
    # `_replace`: the starts the last-good's start check counted are kept.
    signal.write(effectors.paths.signal_file,
                 sig._replace(attempt=int(attempt), deadline=deadline))
