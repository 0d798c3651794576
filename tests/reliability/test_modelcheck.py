"""The model check at its small bound (docs/reliability.md, "The model check"): every
interleaving of the node's processes, systemd's units and one fault, run on the real code,
keeps every rule of docs/design.md's "The rules, model-checked"; a broken rule fails with the
shortest trace as a timeline. `make modelcheck` runs the deep bound."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from agent_fsm.machine.definition import Role
from agent_fsm.upgrade import roles
from agent_fsm_lab.modelcheck.search import BOUNDS, check
from agent_fsm_lab.modelcheck.timeline import render, report

pytestmark = pytest.mark.timeout(240)


def test_every_interleaving_within_the_small_bound_keeps_the_rules(
        record_property: Callable[[str, object], None]) -> None:
    """Breadth-first over every configuration one fault and one operator command away on
    systemd 252 and 257: no rule is broken anywhere and, once the faults stop, every
    configuration converges with the gate open within K steps, without an operator."""
    result = check(BOUNDS["small"])
    record_property("modelcheck", result.figures().replace("\n", "; "))
    assert not result.violations, "\n\n" + report(result)
    assert result.k is not None and result.states > 100
    assert result.parked == 0, result.parked_kinds  # the serving daemon finishes a dead command


def test_a_candidate_running_the_way_back_is_caught_with_its_trace(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With the role check broken on purpose (every daemon counts as the last-good's), the
    check finds a candidate's process recording a transition of the way back, and shows who
    ran, what fired and what was on disk, step by step."""
    role = roles.Process.role

    def broken(self: roles.Process, doc: object) -> Role | None:
        got = role(self, doc)  # type: ignore[arg-type]
        return Role.last_good if self.command == roles.Command.daemon and got else got

    monkeypatch.setattr(roles.Process, "role", broken)
    result = check(replace(BOUNDS["small"], systemds=(257,), operator_commands=("upgrade",)))
    found = {v.name: v for v in result.violations}
    assert "way-back-by-last-good" in found, report(result)
    text = render(found["way-back-by-last-good"])
    assert "operator: agent-fsm upgrade 2.0.0" in text
    assert "daemon of 2.0.0" in text and "on disk:" in text
