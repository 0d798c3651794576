"""The model check at its small bound (docs/reliability.md, "The model check"): every
interleaving of the node's processes, systemd's units and one fault, run on the real code,
keeps every rule of docs/design.md's "The rules, model-checked"; a broken rule fails with the
shortest trace as a timeline. `make modelcheck` runs the deep bound."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from agent_fsm.machine.definition import Role
from agent_fsm.node.records import known_bad
from agent_fsm.upgrade import roles
from agent_fsm_lab.modelcheck.search import BOUNDS, OLDER_START_LIMIT, check
from agent_fsm_lab.modelcheck.timeline import render, report
from agent_fsm_lab.modelcheck.units import Units, start_limit

pytestmark = pytest.mark.timeout(240)


def test_every_interleaving_within_the_small_bound_keeps_the_rules(
        record_property: Callable[[str, object], None]) -> None:
    """Breadth-first over every configuration one fault and one operator command away on
    systemd 252 and 257, the first release's agent unit as written now and as an older release
    wrote it (with a start limit): no rule is broken anywhere and, once the faults stop, every
    configuration converges with the gate open within K steps, without an operator."""
    result = check(BOUNDS["small"])
    record_property("modelcheck", result.figures().replace("\n", "; "))
    assert not result.violations, "\n\n" + report(result)
    assert result.k is not None and result.states > 100


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
    result = check(replace(BOUNDS["small"], systemds=(257,), agent_units=("current",),
                           operator_commands=("upgrade",)))
    found = {v.name: v for v in result.violations}
    assert "way-back-by-last-good" in found, report(result)
    text = render(found["way-back-by-last-good"])
    assert "operator: agent-fsm upgrade 2.0.0" in text
    assert "daemon of 2.0.0" in text and "on disk:" in text


def test_the_older_units_start_limit_refuses_the_start_after_its_burst_until_reset_failed() -> None:
    """As systemd applies `StartLimitBurst=` (systemd.unit(5)): the third start within the
    interval is refused and leaves the unit failed with `OnFailure=` started, a restart without
    `reset-failed` is refused again (its job runs at once), and one after it goes."""
    limit = start_limit(f"[Unit]\n{OLDER_START_LIMIT.replace('${max_attempts}', '2')}\n".encode())
    assert limit == 2
    u = Units(systemd=252, agent="activating", limit=limit).counted_start()
    assert not u.start_refused
    u = u.agent_failed()  # Restart=on-failure; on 252 no OnFailure= before the limit
    assert (u.agent, u.recovery) == ("activating", "inactive")
    u = u.counted_start()
    assert not u.start_refused
    u = u.agent_failed().counted_start()
    assert u.start_refused
    u = u.start_limit_hit()
    assert (u.agent, u.recovery) == ("failed", "activating")
    assert u.answer("a.service", "a.service")["Result"] == "start-limit-hit"
    u = replace(u, recovery="inactive")
    again = u.apply([("restart", "a.service")], "a.service", "r.service", None)
    assert (again.agent, again.recovery) == ("failed", "activating")  # the job refused at once
    reset = u.apply([("reset-failed", "a.service"), ("restart", "a.service")], "a.service",
                    "r.service", None).counted_start()
    assert reset.agent == "activating" and not reset.start_refused


def test_a_rollback_left_unmarked_is_caught_with_its_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the known-bad mark broken on purpose (it writes nothing and says it did), the check
    finds a rollback recorded with its version not marked known bad, and shows the recover
    that rolled it back."""
    monkeypatch.setattr(known_bad, "mark", lambda _file, _mark: False)
    result = check(replace(BOUNDS["small"], systemds=(257,), agent_units=("current",),
                           operator_commands=("upgrade",)))
    found = {v.name: v for v in result.violations}
    assert "rolled-back-is-marked" in found, report(result)
    text = render(found["rolled-back-is-marked"])
    assert "operator: agent-fsm upgrade 2.0.0" in text
    assert "fired recover" in text and "2.0.0 rolled back here" in text
