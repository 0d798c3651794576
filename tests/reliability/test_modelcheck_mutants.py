"""The mutation link (agent_fsm_lab/modelcheck/mutants.py): a one-step variant of the definition
that breaks a rule is caught by the model check, by that rule; one whose change makes no
difference to what any reachable configuration shows is equivalent; and equivalence is judged on
systemd 252 and 257 both, whose `OnFailure=` differ. `make mutants --modelcheck-first` leans on
these verdicts (docs/reliability.md, "The model check")."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from agent_fsm_lab.modelcheck import mutants
from agent_fsm_lab.modelcheck.search import BOUNDS

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("modelcheck-mutants")]

# The mutant bound, cut to what these verdicts need (the unit agent-fsm writes now, the operator's
# `upgrade` and `install`): each search here is the whole bound's in kind, a quarter in size.
BOUND = replace(BOUNDS["mutant"], agent_units=("current",), operator_commands=("upgrade", "install"))


@pytest.fixture(scope="module")
def texts() -> dict[str, str]:
    return {v.id: v.text for v in mutants.variants()}


@pytest.fixture(scope="module")
def whole() -> mutants.Searched:
    """The shipped definition's search at the mutant bound."""
    found = mutants.search(mutants.SHIPPED, None, BOUND, False)
    assert not found.refused and not found.broken, found
    return found


@pytest.fixture(scope="module")
def shipped(whole: mutants.Searched) -> frozenset[Any]:
    return whole.behaviour


def test_a_variant_that_breaks_a_rule_is_caught_by_that_rule(
        texts: dict[str, str], whole: mutants.Searched, shipped: frozenset[Any]) -> None:
    """`complete` without `promote_last_good` settles in converged with the candidate selected
    and the old release last-good: caught by `converged-is-last-good`, the search ending there."""
    vid = "complete: drop effect promote_last_good"
    found = mutants.search(vid, texts[vid], BOUND, True)
    outcome, why = mutants.classify(found, shipped)
    assert outcome == "caught", why
    assert why.startswith("converged-is-last-good (3 steps)"), why
    assert found.states < whole.states  # it stopped at its first violation


def test_a_transition_that_acts_before_closing_the_gate_is_caught(
        texts: dict[str, str], shipped: frozenset[Any]) -> None:
    """`install` selecting the release before it closes the gate: a crash between leaves the
    gate open with `install` owed and half done, which `gate-means-done` forgives only while
    an owed transition has run nothing yet."""
    vid = "install: swap effects close_gate <-> select_release"
    outcome, why = mutants.classify(mutants.search(vid, texts[vid], BOUND, True), shipped)
    assert (outcome, why.split(" (")[0]) == ("caught", "gate-means-done"), why


def test_a_variant_whose_change_makes_no_difference_is_equivalent(
        texts: dict[str, str], shipped: frozenset[Any]) -> None:
    """`complete` publishing its result after clearing the known-bad mark instead of before: two
    independent steps, each resumed after a crash between them, so every configuration shows
    what the shipped order shows."""
    vid = "complete: swap effects publish_result <-> clear_known_bad"
    found = mutants.search(vid, texts[vid], BOUND, True)
    outcome, why = mutants.classify(found, shipped, "complete")
    assert outcome == "equivalent", why
    assert mutants.exercised(found, "complete", None)  # it fired: the order really was tried


def test_a_variant_that_differs_on_systemd_252_alone_is_not_equivalent(
        texts: dict[str, str], shipped: frozenset[Any]) -> None:
    """`judge_failed` without `start_recovery` looks equivalent on systemd 257 (its `OnFailure=`
    starts the recovery at every failure), not on 252, where only the definition starts it:
    `judged-failed-starts-recovery` catches it."""
    vid = "judge_failed: drop effect start_recovery"
    found = mutants.search(vid, texts[vid], BOUND, True)
    outcome, why = mutants.classify(found, shipped)
    assert outcome != "equivalent", why
    if outcome == "caught":
        assert why.startswith("judged-failed-starts-recovery"), why
    if outcome == "survived":
        assert {units[0] for _, units in found.behaviour ^ shipped} == {252}, why


def test_a_variant_the_node_cannot_be_installed_with_is_caught(texts: dict[str, str]) -> None:
    """`install` promoting a last-good before selecting it fails the first release's install,
    before any search: caught, saying so."""
    vid = "install: swap effects select_release <-> promote_last_good"
    outcome, why = mutants.classify(mutants.search(vid, texts[vid], BOUND, True), frozenset())
    assert outcome == "caught"
    assert why.startswith("the node cannot be installed with it: no release is selected"), why


def test_the_verdicts_come_back_from_worker_processes() -> None:
    """Run through worker processes at a bound with no fault (a second or two), a variant that
    breaks a rule comes back caught and one that does not, judged against the shipped
    definition's behaviour checked alongside, comes back with a verdict of its own."""
    bound = replace(BOUND, faults=0, operator_commands=("upgrade",))
    wanted = {"complete: drop effect promote_last_good", "judge_ok: add source converged"}
    got = {v.id: v.outcome for v in mutants.run(lambda vid: vid in wanted, jobs=2, bound=bound)}
    assert got == {"complete: drop effect promote_last_good": "caught",
                   "judge_ok: add source converged": "equivalent"}


def test_an_equivalent_whose_change_is_never_tried_says_so(whole: mutants.Searched) -> None:
    """An equivalent verdict says when the bound never tried the change: an operator's one
    command meets a settled node, so `begin_upgrade`'s `gate_open` never refuses and `install`
    never fires from `recovering`; `complete`, which fires, is not flagged."""
    same = whole.behaviour
    _, why = mutants.classify(whole, same, "begin_upgrade", dropped="gate_open",
                              refused=whole.refusals)
    assert "never exercised: gate_open never refuses begin_upgrade" in why
    _, why = mutants.classify(whole, same, "install", source="recovering")
    assert "never exercised: install never fires from recovering" in why
    outcome, why = mutants.classify(whole, same, "complete")
    assert outcome == "equivalent" and mutants.UNEXERCISED not in why


def test_a_variant_that_differs_only_on_the_way_is_equivalent_at_rest(
        texts: dict[str, str], shipped: frozenset[Any]) -> None:
    """`install` writing the assets before it promotes the release: a crash between the two
    shows a configuration the shipped order never does (the new assets, the old last-good, the
    install owed), every rule holds there, and the resumed install rests where the shipped one
    does: equivalent at rest, not equivalent."""
    vid = "install: swap effects promote_last_good <-> write_assets"
    found = mutants.search(vid, texts[vid], BOUND, True)
    outcome, why = mutants.classify(found, shipped, "install")
    assert outcome == mutants.AT_REST, why
    assert mutants.observable(found.behaviour) != mutants.observable(shipped)
    assert "owing install" in why and "they differ only while a transition is owed" in why


def test_a_start_count_no_start_limit_consults_makes_no_difference(
        texts: dict[str, str], shipped: frozenset[Any]) -> None:
    """`begin_upgrade` without `reset_start_limit`: on an agent unit with no start limit the
    count it leaves is one no property shows and nothing refuses on, so the variant is
    equivalent, and says what it differed in."""
    vid = "begin_upgrade: drop effect reset_start_limit"
    found = mutants.search(vid, texts[vid], BOUND, True)
    outcome, why = mutants.classify(found, shipped, "begin_upgrade")
    assert outcome == "equivalent", why
    assert found.behaviour != shipped and "start count" in why, why


def test_a_judged_failure_rolled_back_as_an_orphan_is_caught(
        texts: dict[str, str], shipped: frozenset[Any]) -> None:
    """`orphaned_signal` also from `judged_failed`: the recovery unit's `recover` then rolls back
    a candidate that failed its checks as if the state file had never known it, marking nothing:
    caught by `rolled-back-is-marked`, an orphan's exemption being only where the state file
    knows no upgrade."""
    vid = "orphaned_signal: add source judged_failed"
    outcome, why = mutants.classify(mutants.search(vid, texts[vid], BOUND, True), shipped)
    assert (outcome, why.split(" (")[0]) == ("caught", "rolled-back-is-marked"), why


def test_a_variant_one_of_whose_paths_rests_elsewhere_is_not_equivalent(
        whole: mutants.Searched) -> None:
    """The same configurations, but from one of them the node rests, once the faults stop,
    where the shipped definition's does not (a path sent to another end the shipped one reaches
    by another way): not equivalent, and the verdict names the configuration."""
    rests = sorted(whole.rests, key=repr)
    shown, rest = next((s, r) for s, r in rests if r[0].last_result is None)
    other = next(r for _, r in rests if r[0].last_result is not None)
    moved = replace(whole, rests=(whole.rests - {(shown, rest)}) | {(shown, other)})
    outcome, why = mutants.classify(moved, whole.behaviour, rests=whole.rests)
    assert outcome == "survived" and "rests elsewhere" in why, why
    assert mutants.classify(whole, whole.behaviour, rests=whole.rests)[0] == "equivalent"
