"""Power loss at every file operation of a transition: what was not fsynced is dropped (an
append not fsynced comes back torn), yet the state file and assets come back old or new, the
history journal shows each committed transition once and no other, and the node converges."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_fsm.node.config import Config
from agent_fsm.node.state import journal
from agent_fsm.node.state.store import Store
from tests.helpers import DEFAULT_CONFIG, World, copy_tree, make_world
from tests.machine.test_machine import _args, _to
from tests.reliability.powerloss import Crash, PowerLoss

COVERED: list[str] = []
CASES = [("begin_upgrade", "converged"), ("candidate_started", "candidate_running"),
         ("complete", "judged_ok"), ("recover", "candidate_running"),
         ("recovered", "recovering"), ("install", "idle")]
# With history_limit 1 every append rotates the journal: its atomic rewrite under power loss.
ROTATING = DEFAULT_CONFIG._replace(history_limit=1)
RUNS = [(*c, DEFAULT_CONFIG) for c in CASES] + [("candidate_started", "candidate_running", ROTATING)]


def _end(world: World) -> tuple[object, ...]:
    doc = world.node.store.read()
    host = world.node.effectors
    sig = host.signal()
    trail = tuple((e["seq"], e["trigger"], e["from"], e["to"]) for e in world.node.store.history())
    return (doc.state, doc.pending is None, host.releases.selected(), host.releases.last_good(),
            None if sig is None else sig.to_version, host.gate.is_open(),
            tuple(sorted(world.assets_on_disk().items())), trail)


def _count_ops(tmp_path: Path, trigger: str, source: str, monkeypatch: pytest.MonkeyPatch,
               config: Config) -> int:
    world = make_world(tmp_path / "count", config)
    _to(source)(world)
    args = _args(trigger, world)
    layer = PowerLoss(world.root)
    layer.install(monkeypatch)
    world.node.controller.fire(trigger, **args)
    monkeypatch.undo()
    return layer.ops


@pytest.mark.parametrize(("trigger", "source", "config"), RUNS,
                         ids=[c[0] + ("-rotating" if c[2] is ROTATING else "") for c in RUNS])
def test_power_loss_at_every_operation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       trigger: str, source: str, config: Config) -> None:
    """For each file operation N of the transition, and once after the last: cut the power
    before it, drop what was not durable, and check the state file and assets are each old or
    new and the history journal holds every committed transition, then that the next start
    (resuming or, if nothing was recorded, firing again) ends like an uninterrupted run."""
    reference = make_world(tmp_path / "ref", config)
    _to(source)(reference)
    before_assets = reference.assets_on_disk()
    before_state = reference.paths.state_file.read_bytes() if reference.paths.state_file.exists() \
        else None
    reference.node.controller.fire(trigger, **_args(trigger, reference))
    after_assets = reference.assets_on_disk()
    expected = _end(reference)
    if config is ROTATING:  # rewritten to the last committed entry and the new one
        assert reference.node.store.journal.path.read_bytes().count(b"\n") == 2

    total = _count_ops(tmp_path, trigger, source, monkeypatch, config)
    assert total > 3
    prepared = make_world(tmp_path / "prepared", config)
    _to(source)(prepared)
    args = _args(trigger, prepared)
    recorded = prepared.node.store.read().seq  # transitions committed before this one
    for n in range(1, total + 2):  # total + 1: the power goes out once the run has finished
        copy_tree(prepared.root, tmp_path / f"n{n}")
        world = make_world(tmp_path / f"n{n}", config)
        layer = PowerLoss(world.root, crash_at=n)
        layer.install(monkeypatch)
        if n <= total:
            with pytest.raises(Crash):
                world.node.controller.fire(trigger, **args)
        else:
            world.node.controller.fire(trigger, **args)
        monkeypatch.undo()
        layer.lose_power()

        back = world.reopen()
        store: Store = back.node.store
        doc = store.read()  # never torn: it decodes, checksum and all
        if doc.pending is None:
            assert store.path.exists() or before_state is None
        kept = [e["seq"] for e in store.history(doc)]  # the committed ones, the last included
        assert kept == list(range(doc.seq - len(kept) + 1, doc.seq + 1)) and (kept or not doc.seq)
        for name, content in back.assets_on_disk().items():
            assert content in (before_assets[name], after_assets[name]), (n, name)
        if doc.pending is None and doc.seq == recorded:
            back.node.controller.fire(trigger, **args)  # nothing was recorded: do it again
        else:
            back.node.controller.resume()
        assert _end(back) == expected, n
        COVERED.append(f"{trigger}:{n}")


# An upgrade cycle under one power-loss layer but for its last transition: the power goes out in
# a later transition, after earlier ones committed theirs; `complete` is the next transition after
# the loss, which repairs what the cut left of the journal's tail.
CYCLE = ("begin_upgrade", "candidate_started", "judge_ok", "complete")
CUT = 3  # the power is cut in the first three
CYCLE_COVERED: list[int] = []


def _journal_seqs(store: Store) -> list[int]:
    """The seq of every line of the journal file, each line decoded (raises if one does not)."""
    return [journal.decode(line)["seq"] for line in store.journal.path.read_bytes().splitlines()]


def _cycle(world: World, args: dict[str, dict[str, str]], start: int, end: int) -> None:
    for trigger in CYCLE[start:end]:
        world.node.controller.fire(trigger, **args[trigger])


def test_power_loss_across_an_upgrade_cycle(tmp_path: Path) -> None:
    """Cut the power at every file operation of an upgrade cycle's first three transitions: the
    state decodes, the journal on disk holds every committed transition once, consecutive up to
    the state's seq (each line fsynced with its transition), and once the node has finished the
    cycle the journal is whole (every line decodes, no damage) and the node ends as an
    uninterrupted run does. A line cut off mid-append comes back torn at half the points and
    lost whole at the others."""
    reference = make_world(tmp_path / "ref")
    _to("converged")(reference)
    args = {t: _args(t, reference) for t in CYCLE}
    _cycle(reference, args, 0, len(CYCLE))
    expected, expected_seqs = _end(reference), _journal_seqs(reference.node.store)

    prepared = make_world(tmp_path / "prepared")
    _to("converged")(prepared)
    for t in CYCLE:
        _args(t, prepared)
    recorded = prepared.node.store.read().seq
    copy_tree(prepared.root, tmp_path / "count")
    counting = make_world(tmp_path / "count")
    layer = PowerLoss(counting.root)
    with pytest.MonkeyPatch.context() as mp:
        layer.install(mp)
        _cycle(counting, args, 0, CUT)
    total = layer.ops
    for n in range(1, total + 2):  # total + 1: the power goes out once they have finished
        copy_tree(prepared.root, tmp_path / f"n{n}")
        world = make_world(tmp_path / f"n{n}")
        # An append not fsynced comes back torn at odd points, as whole lines only at even.
        layer = PowerLoss(world.root, crash_at=n, whole_lines=n % 2 == 0)
        with pytest.MonkeyPatch.context() as mp:
            layer.install(mp)
            try:
                _cycle(world, args, 0, CUT)
            except Crash:
                assert n <= total
        layer.lose_power()

        back = world.reopen()
        store: Store = back.node.store
        doc = store.read()  # never torn: it decodes, checksum and all
        kept = [e["seq"] for e in store.history(doc)]  # read off the journal file alone
        assert kept == list(range(1, doc.seq + 1)), n  # no gap, no duplicate, none beyond
        # After each transition recorded from here on, the journal file itself is whole:
        # every line decodes, each committed transition once, in order.
        back.node.controller.resume()
        if store.read().seq > doc.seq:
            assert _journal_seqs(store) == list(range(1, doc.seq + 2)), n
        for trigger in CYCLE[store.read().seq - recorded:]:
            back.node.controller.fire(trigger, **args[trigger])
            assert _journal_seqs(store) == list(range(1, store.read().seq + 1)), n
        assert _journal_seqs(store) == expected_seqs, n
        assert store.read_journal().damaged == (), n
        assert _end(back) == expected, n
        CYCLE_COVERED.append(n)
    assert len(CYCLE_COVERED) > 50
