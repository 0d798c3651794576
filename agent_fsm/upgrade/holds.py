"""What holds an upgrade back unless it is forced, besides a known-bad mark (`known_bad`): an
operator's hold (`agent-fsm hold`; the record: `node.records.hold`) and a workload's inhibitor
(`node.runtime.inhibitors`)."""

from __future__ import annotations

from ..errors import AgentFsmError
from ..machine.engine import Step
from ..node.records import hold
from ..node.runtime import inhibitors
from .effectors import Effectors


def not_held(effectors: Effectors, step: Step) -> AgentFsmError | None:
    return hold.refusal(hold.read(effectors.paths.hold_file), effectors.clock.now(),
                        force=bool(step.arg("force")))


def not_inhibited(effectors: Effectors, step: Step) -> AgentFsmError | None:
    return inhibitors.refusal(inhibitors.scan(effectors.paths.inhibitor_dir),
                              force=bool(step.arg("force")))
