"""The model check at its small bound (docs/reliability.md, "The model check"): every
interleaving of the node's processes, systemd's units and one fault, run on the real code,
keeps every rule of docs/design.md's "The rules, model-checked"; a broken rule fails with the
shortest trace as a timeline. `make modelcheck` runs the deep bound."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agent_fsm import files
from agent_fsm.actions.releases import pruning
from agent_fsm.machine.definition import Role
from agent_fsm.machine.reading import shipped
from agent_fsm.node.records import known_bad
from agent_fsm.node.releases import tree as release_tree
from agent_fsm.node.state.store import StateDoc
from agent_fsm.upgrade import registry, roles
from agent_fsm.wiring import Node
from agent_fsm_lab.modelcheck.search import (
    BOUNDS,
    OLDER_START_LIMIT,
    Checker,
    Result,
    Violation,
    check,
)
from agent_fsm_lab.modelcheck.timeline import render, report
from agent_fsm_lab.modelcheck.tree import Tree
from agent_fsm_lab.modelcheck.units import ModelSystemd, Units, start_limit, unit_label

pytestmark = pytest.mark.timeout(240)
# The small bound cut to what a rule broken on purpose needs: one `upgrade`, systemd 257, the
# agent unit as written now (each test widens it where its rule needs more).
ONE_UPGRADE = replace(BOUNDS["small"], systemds=(257,), agent_units=("current",),
                      operator_commands=("upgrade",))


def broken_rule(result: Result, name: str) -> str:
    """The trace of the rule `name` the check found broken, rendered; fails with the whole
    report when it found that rule kept."""
    found = {v.name: v for v in result.violations}
    assert name in found, report(result)
    return render(found[name])


def test_every_interleaving_within_the_small_bound_keeps_the_rules(
        record_property: Callable[[str, object], None]) -> None:
    """Breadth-first over every configuration one fault and one operator command away on
    systemd 252 and 257, the first release's agent unit as written now and as an older release
    wrote it (with a start limit): no rule is broken anywhere and, once the faults stop, every
    configuration converges with the gate open within K steps, without an operator. Every
    trigger of states/agent-upgrade.toml fires somewhere (a transition the model never reaches
    is one whose rules it never checks), `orphaned_signal` among them: a state file put back
    as it was (a backup, a config-management run, a lost file) while an upgrade is pending is
    rolled back by the last-good's code, with a trace that says what was restored, who ran and
    what fired. (One test, not three: the search is the expensive part, and the suite's workers
    would each make it again.)"""
    small = Checker(BOUNDS["small"])
    result = small.run()
    record_property("modelcheck", result.figures().replace("\n", "; "))
    assert not result.violations, "\n\n" + report(result)
    assert result.k is not None and result.states > 100
    assert result.parked == 0, result.parked_kinds  # the serving daemon finishes a dead command

    declared = {t.trigger for t in shipped().transitions}
    assert declared - result.fired == set(), result.figures()

    reached = [s for s in small.states.values() if s.via is not None
               and any(f.startswith("orphaned_signal ") for f in s.via.fired)]
    assert reached and all(s.via is not None and s.via.by_last_good for s in reached)
    first = min(reached, key=lambda s: s.depth)
    text = render(Violation("orphaned_signal", "reached", small.trace(first)))
    assert "operator: agent-fsm upgrade 2.0.0" in text and "[fault: restore " in text, text
    assert "fired orphaned_signal converged→recovering" in text and "of 1.0.0" in text, text


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
    result = check(ONE_UPGRADE)
    text = broken_rule(result, "way-back-by-last-good")
    assert "operator: agent-fsm upgrade 2.0.0" in text
    assert "daemon of 2.0.0" in text and "on disk:" in text


def test_an_add_that_stores_a_release_before_its_files_are_durable_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With the add's sync of its copy left out on purpose, the check finds a power cut after
    `release add 3.0.0` renamed it into place, leaving a stored release whose files came back
    empty (`releases-kept`), and shows the add, the cut and the store's own words."""
    unsynced = SimpleNamespace(**{**vars(release_tree.files), "sync_filesystem": lambda _d: None})
    monkeypatch.setattr(release_tree, "files", unsynced)  # the rest of `files` as it is
    result = check(replace(BOUNDS["small"], systemds=(257,), operator_commands=("add",)))
    text = broken_rule(result, "releases-kept")
    assert "operator: agent-fsm release add 3.0.0 [fault: power-op" in text, text
    assert "3.0.0 is damaged" in text and "does not match its digest" in text, text


def test_a_prune_that_removes_the_last_good_during_a_judgment_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With prune sparing the last-good only while it is also the selected (broken on purpose),
    the store bound finds `release prune` removing it while the candidate is judged, the way
    back's own release gone (`releases-kept`), and shows the upgrade and the prune."""
    protected = pruning.protected

    def forgetful(node: Node, doc: StateDoc) -> dict[str, list[str]]:
        why = protected(node, doc)
        if node.releases.last_good() != node.releases.selected():
            why.pop(str(node.releases.last_good()), None)
        return why

    monkeypatch.setattr(pruning, "protected", forgetful)
    result = check(replace(BOUNDS["store"], systemds=(257,), faults=0,
                           operator_commands=("upgrade", "prune")))
    text = broken_rule(result, "releases-kept")
    assert "1.0.0 (last-good, the signal's from) is not stored" in text, text
    assert "operator: agent-fsm release prune --keep 0" in text and "removed 1.0.0" in text


def test_a_configuration_put_back_keeps_the_stores_hard_links(tmp_path: Path) -> None:
    """A node's files taken as a configuration and put back keep which names are one file (the
    store's objects, whose link count is its refcount), also where the file behind them was
    written anew in between."""
    node = tmp_path / "node"

    def store(data: bytes) -> Tree:
        for p in (node / "objects" / "a", node / "r1", node / "r2"):
            p.unlink(missing_ok=True)
        (node / "objects").mkdir(parents=True, exist_ok=True)
        (node / "objects" / "a").write_bytes(data)
        for name in ("r1", "r2"):
            os.link(node / "objects" / "a", node / name)
        return Tree.take(node)

    shared = store(b"shared")
    store(b"other")
    shared.put(node)
    inodes = {(node / n).stat().st_ino for n in ("objects/a", "r1", "r2")}
    assert len(inodes) == 1 and (node / "r2").stat().st_nlink == 3
    assert (node / "r1").read_bytes() == b"shared"


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
    result = check(ONE_UPGRADE)
    text = broken_rule(result, "rolled-back-is-marked")
    assert "operator: agent-fsm upgrade 2.0.0" in text
    assert "fired recover" in text and "2.0.0 rolled back here" in text


def test_a_gate_opened_before_systemd_loaded_the_new_unit_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With `reload_systemd` broken on purpose (it asks systemd nothing), the check finds the
    gate open after an upgrade while systemd still has the last-good's agent unit loaded, and
    shows the `complete` that wrote the new one."""
    monkeypatch.setitem(registry.EFFECTS, "reload_systemd", lambda _effectors, _step: None)
    result = check(ONE_UPGRADE)
    text = broken_rule(result, "gate-after-reload")
    assert "operator: agent-fsm upgrade 2.0.0" in text and "fired complete" in text
    assert "1.0.0's unit file loaded" in text


def test_systemd_answers_need_daemon_reload_from_the_unit_it_loaded() -> None:
    """`NeedDaemonReload=` as systemd answers it: false while the file on disk is the one
    loaded, true once it is rewritten, false again after a `daemon-reload` (which loads the
    file as it is at the call, not as it is later)."""
    disk = [b"# Written by agent-fsm 1.0.0. x\n"]
    sd = ModelSystemd(Units(loaded=unit_label(disk[0])), "a.service", unit_file=lambda: disk[0])
    assert not sd.reload_needed(["a.service"])
    disk[0] = b"# Written by agent-fsm 2.0.0. x\n"
    assert sd.reload_needed(["a.service"])
    sd.daemon_reload()
    assert not sd.reload_needed(["a.service"])
    disk[0] = b"# Written by agent-fsm 3.0.0. x\n"
    after = sd.units.apply(sd.calls, "a.service", "r.service", disk[0])
    assert after.loaded is not None and after.loaded.startswith("2.0.0:")


def test_an_install_that_leaves_the_old_assets_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """With `write_assets` broken on purpose (it writes nothing), the check finds an operator's
    `install 2.0.0` that exits 0 with 1.0.0's assets still on disk."""
    monkeypatch.setitem(registry.EFFECTS, "write_assets", lambda _effectors, _step: None)
    result = check(replace(ONE_UPGRADE, operator_commands=("install",)))
    text = broken_rule(result, "install-does-it")
    assert "operator: agent-fsm install 2.0.0" in text and "left: assets 1.0.0" in text


def test_an_install_that_leaves_the_agent_unit_disabled_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With `enable_unit` broken on purpose (it enables nothing), the check finds that after a
    power loss nothing starts the agent again: the way back is not live."""
    monkeypatch.setitem(registry.EFFECTS, "enable_unit", lambda _effectors, _step: None)
    result = check(replace(ONE_UPGRADE, kinds=frozenset({"power"})))
    text = broken_rule(result, "way-back-is-live")
    assert "the host boots" in text and "disabled" in text and "nothing runs any more" in text


def test_an_upgrade_that_settles_without_its_result_recorded_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With `publish_result` broken on purpose (it delivers what is queued but records nothing),
    the check finds the node settled after an upgrade ended ok with no `last_result` naming it
    in the state file, which `status --json` reports."""
    monkeypatch.setitem(registry.EFFECTS, "publish_result",
                        lambda effectors, _step: effectors.publisher.deliver())
    result = check(ONE_UPGRADE)
    text = broken_rule(result, "result-recorded")
    assert "fired complete" in text and "2.0.0 ended ok" in text and "says nothing" in text


def test_a_failed_judgment_that_leaves_the_recovery_unit_alone_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With `start_recovery` broken on purpose (it starts nothing), the check finds, on systemd
    252 (whose `OnFailure=` waits for the start limit), the candidate's daemon recording
    judge_failed with the recovery unit not started."""
    monkeypatch.setitem(registry.EFFECTS, "start_recovery", lambda _effectors, _step: None)
    result = check(replace(ONE_UPGRADE, systemds=(252,)))
    text = broken_rule(result, "judged-failed-starts-recovery")
    assert "fired judge_failed" in text and "recovery unit not started" in text


def test_a_rollback_that_leaves_the_candidate_selected_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With `select_last_good` broken on purpose (it selects nothing), the check finds the node
    rolling back with the candidate still selected, so the restart the rollback owes would run
    the candidate's code again, and shows the `recover` that did it."""
    monkeypatch.setitem(registry.EFFECTS, "select_last_good", lambda _effectors, _step: None)
    result = check(ONE_UPGRADE)
    text = broken_rule(result, "way-back-selects-last-good")
    assert "fired recover" in text and "2.0.0 is selected, not last-good 1.0.0" in text


def test_an_upgrade_that_selects_its_candidate_without_a_signal_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With `write_signal` broken on purpose (it records the upgrade in the state file but
    leaves no signal on disk), the check finds an operator's `upgrade` that leaves its candidate
    selected with no signal naming it: the agent's next start would run it unjudged, its starts
    uncounted."""
    write = registry.EFFECTS["write_signal"]

    def lost(effectors: Any, step: Any) -> None:
        write(effectors, step)
        effectors.paths.signal_file.unlink()

    monkeypatch.setitem(registry.EFFECTS, "write_signal", lost)
    result = check(ONE_UPGRADE)
    text = broken_rule(result, "candidate-is-signalled")
    assert "operator: agent-fsm upgrade 2.0.0" in text and "no signal names it" in text


def test_a_rollback_whose_restart_systemd_refuses_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With `reset_start_limit` broken on purpose (it resets nothing), the check finds, through
    the agent unit an older release wrote (a start limit of two starts), a rollback whose
    restart systemd refuses at the start limit, the unit left failed, though the reset was not
    let pass: the way back then waits on the recovery unit's next try."""
    monkeypatch.setitem(registry.EFFECTS, "reset_start_limit", lambda _effectors, _step: None)
    result = check(replace(ONE_UPGRADE, systemds=(252,), agent_units=("older",)))
    text = broken_rule(result, "restart-not-refused")
    assert "refused the restart it queued" in text and "start-limit-hit" in text


def test_an_abandoned_upgrade_rolled_back_later_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """With `abandon_upgrade`'s `clear_signal` broken on purpose (it leaves the signal), the check
    finds an upgrade cut before its candidate started, abandoned by the serving daemon's look,
    then rolled back as an orphan: a rollback recorded for a version that never ran."""
    clear = registry.EFFECTS["clear_signal"]

    def kept(effectors: Any, step: Any) -> None:
        if step.trigger != "abandon_upgrade":
            clear(effectors, step)

    monkeypatch.setitem(registry.EFFECTS, "clear_signal", kept)
    result = check(ONE_UPGRADE)
    text = broken_rule(result, "abandoned-is-not-rolled-back")
    assert "fired abandon_upgrade" in text and "fired orphaned_signal" in text


def test_a_full_disk_that_escapes_as_a_traceback_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """With agent-fsm's translation of a failing write broken on purpose (an OSError passes out
    raw instead of the one-line DiskError that says what to free), the check finds a process
    ending in a traceback at the full disk, and names it."""
    @contextlib.contextmanager
    def raw(*_args: Any, **_kwargs: Any) -> Iterator[None]:
        yield

    monkeypatch.setattr(files, "_disk", raw)
    result = check(replace(ONE_UPGRADE, kinds=frozenset({"enospc"})))
    text = broken_rule(result, "no-traceback")
    assert "traceback: OSError: [Errno 28] No space left on device" in text


def test_a_lost_signal_that_leaves_the_candidate_restarting_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With the way back from a lost signal broken on purpose (the start check lets a start it
    cannot count go on, the candidate's daemon dies on the missing signal), the check finds the
    signal deleted while the upgrade is pending and the candidate restarted for ever on
    systemd 252, each start ending in a traceback."""
    from agent_fsm.agent import daemon, start_check

    count = start_check._count

    def counts_none(node: Any) -> Any:
        counted = count(node)
        return None if isinstance(counted, str) else counted

    def dies(*_args: Any) -> bool:
        raise AssertionError("no signal")

    monkeypatch.setattr(start_check, "_count", counts_none)
    monkeypatch.setattr(daemon.Daemon, "not_judged", dies)
    # On 252, where `OnFailure=` waits for a failure for good, which never comes.
    result = check(replace(ONE_UPGRADE, systemds=(252,), kinds=frozenset({"signal"})))
    text = broken_rule(result, "way-back-is-live")
    assert "[fault: signal lost]" in text and "traceback: AssertionError" in text


def test_a_recovery_still_at_work_never_rolls_back_the_next_upgrade(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two upgrades on one path (the `again` bound, cut to systemd 252 and a full disk): a start
    of 2.0.0 refused on the full disk queues the recovery unit, the next start runs 2.0.0, judged
    ok, converged; an upgrade back to 1.0.0 then is refused while that recovery unit is at work,
    so its `recover` never rolls the new candidate back. With `recovery_idle` broken on purpose
    (it always holds), the check finds the rollback, 1.0.0 marked known bad though it never ran."""
    again = replace(BOUNDS["again"], systemds=(252,), agent_units=("current",),
                    kinds=frozenset({"enospc"}))
    kept = check(again)
    assert not kept.violations, "\n\n" + report(kept)
    monkeypatch.setitem(registry.CONDITIONS, "recovery_idle", lambda _effectors, _step: None)
    text = broken_rule(check(again), "known-bad-has-cause")
    assert "operator: agent-fsm upgrade 1.0.0" in text, text
    assert "recovery unit: recover of 2.0.0" in text and "fired recover candidate_running" in text
