"""State names and groups come from the definition: the code restates none of it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import agent_fsm
from agent_fsm.actions.recover import ON_RECOVER
from agent_fsm.agent.daemon import ON_START
from agent_fsm.errors import DefinitionError
from agent_fsm.machine.definition import OnRecover, OnStart, default_text, handlers
from agent_fsm.machine.vocabulary import StateName, Trigger, check_vocabulary, count_rules, groups
from agent_fsm.upgrade.registry import load_definition
from agent_fsm.views.status.advice import ADVICE

PACKAGE = Path(agent_fsm.__file__).parent
SHIPPED, _ = default_text()


class TestVocabulary:
    def test_the_shipped_definition_has_every_name_the_code_uses(self) -> None:
        """Every StateName and Trigger is declared by states/agent-upgrade.toml."""
        d = load_definition()
        assert set(StateName) <= set(d.state_names)
        assert set(Trigger) <= {t.trigger for t in d.transitions}

    def test_a_definition_without_a_state_the_code_names_is_refused(self) -> None:
        """Renaming a state in the definition alone fails at load, naming the state."""
        d = load_definition(SHIPPED.replace("recovering", "rolling_back"), "renamed.toml")
        with pytest.raises(DefinitionError, match="lacks what agent-fsm's code names: state "
                                                  "recovering"):
            check_vocabulary(d)

    def test_no_module_spells_a_state_or_trigger_as_a_string(self) -> None:
        """Outside machine/vocabulary.py, code names states and triggers through the enums, so a
        name the definition lacks cannot hide in a string comparison."""
        names = {str(n) for n in (*StateName, *Trigger)}
        found = []
        for path in PACKAGE.rglob("*.py"):
            if path == PACKAGE / "machine" / "vocabulary.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and node.value in names:
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.value!r}")
        assert found == []


class TestGroups:
    def test_groups_of_the_shipped_machine(self) -> None:
        """The groups read off the effects are the ones an operator knows."""
        g = groups(load_definition())
        assert g.pending == {"candidate_running", "judged_ok", "judged_failed", "recovering"}
        assert g.rolling_back == {"judged_failed", "recovering"}
        assert g.recover_from == {"candidate_running", "judged_failed", "recovering"}
        assert g.publishing == {("judge_failed", "candidate_running"),
                                ("recover", "candidate_running"), ("complete", "judged_ok"),
                                ("complete_queued", "judged_ok"),
                                ("orphaned_signal", "idle"), ("orphaned_signal", "converged")}

    def test_groups_follow_the_definition(self) -> None:
        """Change the definition and the groups change with it: nothing is restated in code."""
        text = SHIPPED.replace('source = ["candidate_running", "judged_failed", "recovering"]',
                               'source = ["candidate_running", "judged_failed"]')
        text = text.replace('effects = ["publish_result", "clear_signal",',
                            'effects = ["publish_result",')
        g = groups(load_definition(text, "changed.toml"))
        assert g.recover_from == {"candidate_running", "judged_failed"}

    def test_count_rules_of_the_shipped_machine(self) -> None:
        """Counters: complete (or complete_queued) counts an ok upgrade; the first publish of a
        failure a rollback result; recovered a finished rollback; candidate_started an attempt."""
        d = load_definition()
        rules = count_rules(d, groups(d))
        assert rules.upgrades_ok == {("complete", "judged_ok"), ("complete_queued", "judged_ok")}
        assert rules.upgrades_rolled_back == {("judge_failed", "candidate_running"),
                                              ("recover", "candidate_running"),
                                              ("orphaned_signal", "idle"),
                                              ("orphaned_signal", "converged")}
        assert rules.rollbacks == {"recovered"}
        assert rules.attempts == {"candidate_started"}

    def test_tones(self) -> None:
        """Each state reads to an operator as settled, busy, bad or not installed."""
        d = load_definition()
        g = groups(d)
        assert {s: g.tone(s, d.initial) for s in d.state_names} == {
            "idle": "none", "candidate_running": "busy", "judged_ok": "busy",
            "judged_failed": "bad", "recovering": "bad", "converged": "ok"}


def _declare(text: str, state: str, key: str, action: str) -> str:
    """`text` with `state`'s `key` declared as `action`."""
    head = f"[states.{state}]\n"
    start = text.index(head)
    line = text.index(f"{key} = ", start)
    return text[:line] + f'{key} = "{action}"' + text[text.index("\n", line):]


class TestStartAndRecover:
    def test_each_place_has_a_handler_for_every_declared_name(self) -> None:
        """The daemon, `recover` and `status`'s advice can act on whatever a state declares."""
        d = load_definition()
        assert {s.on_start for s in d.states} <= set(ON_START)
        assert {s.on_start for s in d.states} <= set(ADVICE)
        assert {s.on_recover for s in d.states} <= set(ON_RECOVER)

    def test_a_table_without_a_handler_for_a_name_is_refused_naming_it(self) -> None:
        """A dispatch that lacks a name is refused when it is built, naming the names."""
        with pytest.raises(DefinitionError, match="the daemon has no handler for on_start "
                                                  "finish_recovery, judge_candidate; add one"):
            handlers(OnStart, {a: print for a in OnStart
                               if a not in (OnStart.judge_candidate, OnStart.finish_recovery)},
                     "the daemon")
        with pytest.raises(DefinitionError, match="no handler for on_recover roll_back"):
            handlers(OnRecover, {OnRecover.nothing_pending: print,
                                 OnRecover.nothing_completing: print}, "recover")

    def test_swapped_start_actions_are_refused_naming_the_states(self) -> None:
        """A state declaring a start whose trigger it has no transition for fails at load."""
        text = _declare(SHIPPED, "converged", "on_start", "judge_candidate")
        text = _declare(text, "candidate_running", "on_start", "converge_then_open_gate")
        with pytest.raises(DefinitionError, match=(
                r"these states declare an action their transitions do not allow: "
                r"candidate_running \(on_start = converge_then_open_gate fires settle\), "
                r"converged \(on_start = judge_candidate fires candidate_started\)")):
            check_vocabulary(load_definition(text, "swapped.toml"))

    def test_an_operator_trigger_without_a_command_is_refused(self) -> None:
        """A definition giving the operator a trigger no command names (so no refusal could
        say the user's word for it) fails at load, naming the trigger."""
        old = 'trigger = "settle"\nby = ["last_good"]'
        assert old in SHIPPED
        text = SHIPPED.replace(old, 'trigger = "settle"\nby = ["operator", "last_good"]')
        with pytest.raises(DefinitionError, match=r"these operator triggers have no command "
                                                  r"\(`vocabulary.COMMANDS`\): settle$"):
            check_vocabulary(load_definition(text, "operator.toml"))

    def test_a_state_recover_leaves_must_roll_back(self) -> None:
        """A state `recover` may fire from but whose on_recover does nothing fails at load."""
        text = _declare(SHIPPED, "judged_failed", "on_recover", "nothing_pending")
        with pytest.raises(DefinitionError, match="`recover` may roll back from these states "
                                                  "but their on_recover is not roll_back: "
                                                  "judged_failed"):
            check_vocabulary(load_definition(text, "kept.toml"))

    def test_the_orphan_check_runs_from_orphaned_signals_sources(self) -> None:
        """Where a signal the state file does not know is rolled back is where the definition's
        `orphaned_signal` starts."""
        d = load_definition()
        assert groups(d).orphan_from == set(d.transition("orphaned_signal").sources)
        assert groups(d).orphan_from == {"idle", "converged"}
