"""The machine's definition is checked when it is loaded; errors name what is wrong."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from agent_fsm.errors import DefinitionError
from agent_fsm.machine.definition import Role, default_text
from agent_fsm.upgrade.registry import load_definition

GOOD = """
[machine]
name = "m"
initial = "a"
[states.a]
on_start = "converge_then_open_gate"
on_recover = "nothing_pending"
[states.b]
on_start = "judge_candidate"
on_recover = "roll_back"
[[transitions]]
trigger = "go"
source = "a"
dest = "b"
by = ["operator"]
effects = ["open_gate"]
[[transitions]]
trigger = "back"
source = "b"
dest = "a"
by = ["operator"]
conditions = ["gate_open"]
"""


def _load(text: str) -> None:
    load_definition(text, "test.toml")


class TestChecks:
    def test_a_consistent_definition_loads(self) -> None:
        """A small well-formed machine loads with its states and transitions."""
        d = load_definition(GOOD, "test.toml")
        assert d.state_names == ("a", "b")
        assert d.triggers_from("b") == ("back",)

    @pytest.mark.parametrize(("change", "message"), [
        (lambda t: t.replace('"open_gate"', '"open_gates"'),
         "transition 'go' names unknown effect(s): open_gates"),
        (lambda t: t.replace('"gate_open"', '"gate_is_open"'),
         "transition 'back' names unknown condition(s): gate_is_open"),
        (lambda t: t + '[states.c]\non_start = "finish_recovery"\non_recover = "roll_back"\n',
         "these states cannot be reached from 'a': c"),
        (lambda t: t.replace('trigger = "back"\nsource = "b"\ndest = "a"',
                             'trigger = "back"\nsource = "b"\ndest = "b"'),
         "these states have no way out: b"),
        (lambda t: t + '[[transitions]]\ntrigger = "go"\nsource = "b"\ndest = "a"\n',
         "trigger 'go' is declared more than once"),
        (lambda t: t.replace('dest = "b"', 'dest = "z"'),
         "transition 'go' names undeclared state(s): z"),
        (lambda t: t.replace('initial = "a"', 'initial = "q"'),
         "the initial state 'q' is not declared"),
        (lambda t: t.replace('["open_gate"]', '[{ name = "open_gate", on_error = "ignore" }]'),
         "on_error must be 'fail' or 'log'"),
        (lambda t: t + "[[transitions]]\ntrigger = 'x'\nsource = 'a'\ndest = 'b'\nafter = ['y']\n",
         "unknown key(s) after"),
        (lambda t: t.replace('on_start = "judge_candidate"\n', ''),
         "these states declare no on_start: b; each declares one of: converge_then_open_gate, "
         "finish_recovery, judge_candidate, publish_then_open_gate, refuse_not_installed, "
         "start_recovery_unit"),
        (lambda t: t.replace('on_recover = "nothing_pending"\n', '').replace(
            'on_recover = "roll_back"\n', ''),
         "these states declare no on_recover: a, b; each declares one of: nothing_completing, "
         "nothing_pending, roll_back"),
        (lambda t: t.replace('"judge_candidate"', '"judge"'),
         "state 'b' declares on_start = 'judge', which is not one of: converge_then_open_gate, "),
        (lambda t: t.replace('on_recover = "roll_back"', 'on_recover = ["roll_back"]'),
         "state 'b' declares on_recover = ['roll_back'], which is not one of: "),
        (lambda t: t.replace('dest = "a"\nby = ["operator"]\n', 'dest = "a"\n'),
         "transition 'back' by names no role that may fire it; add `by = [...]` with one or more "
         "of: candidate, last_good, operator, recovery"),
        (lambda t: t.replace('dest = "b"\nby = ["operator"]', 'dest = "b"\nby = ["candidate", "admin"]'),
         "transition 'go' by names unknown role(s) admin; roles: candidate, last_good, operator, "
         "recovery"),
        (lambda t: t.replace('dest = "b"\nby = ["operator"]', 'dest = "b"\nby = []'),
         "transition 'go' by names no role; roles: "),
        (lambda t: t.replace('["open_gate"]', '[{ name = "open_gate", at_own_start = "done" }]'),
         "transition 'go': at_own_start = \"done\" is for restart_unit only, not open_gate"),
        (lambda t: t.replace('["open_gate"]', '[{ name = "open_gate", at_own_start = "skip" }]'),
         "transition 'go' effects: at_own_start must be 'run' or 'done', not 'skip'"),
    ], ids=["unknown effect", "unknown condition", "unreachable", "trap", "duplicate trigger",
            "undeclared state", "bad initial", "bad on_error", "unknown key", "no on_start",
            "no on_recover", "unknown on_start", "on_recover not a name", "no by",
            "unknown role", "empty by", "done at own start not a restart", "bad at_own_start"])
    def test_inconsistent_definition_is_named(self, change, message: str) -> None:  # type: ignore[no-untyped-def]
        """Each kind of inconsistency is refused with an error naming the states or names."""
        with pytest.raises(DefinitionError) as err:
            _load(change(GOOD))
        assert message in str(err.value)

    def test_shipped_definition_keeps_the_way_back_from_the_candidate(self) -> None:
        """In the shipped machine the candidate's process may fire only its own judgment and
        completion, and may finish none of the way back (recover, orphaned_signal, recovered)."""
        d = load_definition()
        fired = {t.trigger for t in d.transitions if Role.candidate in t.by}
        assert fired == {"candidate_started", "judge_ok", "judge_failed", "complete",
                         "complete_queued"}
        way_back = ("recover", "orphaned_signal", "recovered")
        assert not any(d.transition(t).may_finish(Role.candidate) for t in way_back)
        assert all(d.transition(t).may_finish(Role.last_good) for t in way_back)
        assert d.transition("begin_upgrade").may_finish(Role.candidate)  # the operator's

    def test_shipped_definition_declares_the_lifecycle(self) -> None:
        """The shipped machine has the six lifecycle states, idle first."""
        d = load_definition()
        assert d.initial == "idle"
        assert set(d.state_names) == {"idle", "candidate_running", "judged_ok", "judged_failed",
                                      "recovering", "converged"}


class TestPackaging:
    def test_wheel_ships_the_definition(self, tmp_path: Path) -> None:
        """The built wheel contains the definition, so an installed CLI works outside the checkout."""
        root = Path(__file__).resolve().parents[2]
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
             "-w", str(tmp_path), str(root)],
            capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
        wheel = next(tmp_path.glob("agent_fsm-*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            shipped = zf.read("agent_fsm/states/agent-upgrade.toml").decode()
            assert "agent_fsm/templates/agent.service" in zf.namelist()
        assert shipped == default_text()[0]
