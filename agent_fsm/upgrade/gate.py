"""The startup gate as the machine uses it (the gate itself: `node.runtime.gate`).

`gate_open` refuses an operator's transition while the agent is still starting; `close_gate` and
`open_gate` close and open it.
"""

from __future__ import annotations

import logging

from ..errors import AgentFsmError, Refused
from ..machine.engine import Step
from .effectors import Effectors

log = logging.getLogger("agent_fsm")


def gate_open(effectors: Effectors, step: Step) -> AgentFsmError | None:
    if effectors.gate.is_open():
        return None
    paths = effectors.paths
    return Refused(
        f"the startup gate ({paths.gate_file}) is closed: {paths.name} has not "
        f"finished starting (state {step.doc.state}); wait until `agent-fsm status` "
        "shows the gate open"
    )


def close_gate(effectors: Effectors, step: Step) -> None:
    effectors.gate.close()


def open_gate(effectors: Effectors, step: Step) -> None:
    if effectors.gate.open():
        log.info("startup gate open")
    else:
        log.warning("the gate stays closed: %s is not running (its run directory %s is "
                    "absent); its next start opens it", effectors.paths.agent_unit_name,
                    effectors.gate.path.parent)
