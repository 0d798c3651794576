"""The model check with an operator's `agent-fsm follow` (docs/reliability.md, "The model
check"): the server's answer is the search's choice among signed indexes (agent_fsm_lab/
modelcheck/channel.py), and in every configuration a follow never takes a revoked or
known-bad version, the index version it records never goes back, and a refused index changes
nothing; a follow broken on purpose is caught with the shortest timeline."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from agent_fsm.node.channel import rollout, trust
from agent_fsm.node.records import known_bad
from agent_fsm_lab.modelcheck import channel
from agent_fsm_lab.modelcheck.search import BOUNDS, Checker, Result, check
from agent_fsm_lab.modelcheck.timeline import render, report

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(shutil.which("ssh-keygen") is None,
                                 reason="needs OpenSSH's ssh-keygen (Debian: openssh-client)")]
# The follow's bound without faults: what a follow broken on purpose needs to be caught.
CALM = replace(BOUNDS["follow"], faults=0)


def broken_rule(result: Result, name: str) -> str:
    found = {v.name: v for v in result.violations}
    assert name in found, report(result)
    return render(found[name])


def test_every_follow_within_its_bound_keeps_the_rules(
        record_property: Callable[[str, object], None]) -> None:
    """Two follows on a path, each given any of the answers, one fault (a kill, a power loss,
    a full disk) in a follow's step: no rule is broken, every configuration
    converges without an operator, and the search met what the rules are about: a replay of
    v1 after v2 refused, the expired index refused, the upgrade to 2.1.0 begun from v2, and
    3.0.0 (known bad here) never begun."""
    checker = Checker(BOUNDS["follow"])
    result = checker.run()
    record_property("modelcheck_follow", result.figures().replace("\n", "; "))
    assert not result.violations, "\n\n" + report(result)
    assert result.k is not None and result.parked == 0
    ends = [s.via.end for s in checker.states.values()
            if s.via is not None and s.via.process.kind == "follow"]
    assert any("index version 1 is older than version 2 this node has seen: a replayed index"
               in e for e in ends)
    assert any(e.startswith("exit 0: refused: index version 3 expired") for e in ends)
    assert any("1.0.0 → 2.1.0 (2.1.0 is the newest eligible): upgrade begun" in e for e in ends)
    assert not any(f"→ {channel.MARKED}" in e for e in ends)


def test_a_follow_that_believes_a_replayed_index_is_caught() -> None:
    """With the replay check off, v1 given after v2 is believed: the record goes back to v1,
    though the node must have refused it; the timeline shows both follows."""
    real = trust.accept_index

    def forgetful(root: Any, env: Any, *, seen: Any, **kw: Any) -> Any:
        return real(root, env, seen=None, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trust, "accept_index", forgetful)
        result = check(CALM)
    text = broken_rule(result, "follow-index-never-back")
    assert "went from v2 to v1" in text
    assert "the server gives index v2" in text and "the server gives index v1" in text
    assert "(a replay: this node recorded index v2)" in text
    assert "which it must refuse (it is older than index v2, which the node recorded (a " \
        "replay)), and recorded index v1" in broken_rule(result, "follow-refused-changes-nothing")


def test_a_follow_that_believes_an_expired_index_is_caught() -> None:
    """With the expiry check off, the expired index is believed: the node records it and
    begins an upgrade from it, and the rule that a refused index changes nothing says so."""
    real = trust.accept_index

    def timeless(root: Any, env: Any, *, now: datetime, **kw: Any) -> Any:
        return real(root, env, now=datetime(2001, 1, 1, tzinfo=UTC), **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trust, "accept_index", timeless)
        result = check(replace(CALM, operator=1))
    text = broken_rule(result, "follow-refused-changes-nothing")
    assert "index v3 (2.1.0 at 100 %), expired a day before, which it must refuse (it expired)" \
        in text
    assert "fired begin_upgrade" in text and "recorded index v3" in text


def test_a_follow_that_takes_a_revoked_version_is_caught() -> None:
    """With revocations ignored by the choice, index v4 (2.0.0 and 2.1.0 revoked) sends the
    node to 2.1.0."""
    real = rollout.verdict

    def blind(entry: Any, **kw: Any) -> Any:
        return real(entry._replace(revoked=None), **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rollout, "verdict", blind)
        result = check(replace(CALM, operator=1))
    assert "the follow began an upgrade to 2.1.0, revoked in index v4" in broken_rule(
        result, "follow-takes-no-revoked-or-known-bad")


def test_a_follow_that_takes_a_known_bad_version_is_caught() -> None:
    """With known-bad marks ignored by the choice, index v4 makes 3.0.0 (rolled back here)
    eligible: the record says so though begin_upgrade's own refusal holds it; with that refusal
    off too, the node is sent to 3.0.0."""
    real = rollout.choose

    def blind(index: Any, *, known_bad: Any, **kw: Any) -> Any:
        return real(index, known_bad=(), **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rollout, "choose", blind)
        held = check(replace(CALM, operator=1))
        mp.setattr(known_bad, "refusal", lambda _file, _version: None)
        taken = check(replace(CALM, operator=1))
    listed = broken_rule(held, "follow-lists-no-revoked-or-known-bad")
    assert f"the follow's record lists {channel.MARKED} as eligible here, though it is known " \
        "bad on this node" in listed and "upgrade begun" not in listed
    assert "follow-takes-no-revoked-or-known-bad" not in {v.name for v in held.violations}
    assert f"the follow began an upgrade to {channel.MARKED}, known bad on this node" in \
        broken_rule(taken, "follow-takes-no-revoked-or-known-bad")
