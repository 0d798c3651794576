"""Power loss at every file operation of a transition: what was not fsynced is dropped, yet
every file comes back old or new, never torn, and the node converges."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_fsm.node.store import Store
from tests.helpers import World, copy_tree, make_world
from tests.powerloss import Crash, PowerLoss
from tests.test_machine import _args, _to

COVERED: list[str] = []
CASES = [("begin_upgrade", "converged"), ("candidate_started", "candidate_running"),
         ("complete", "judged_ok"), ("recover", "candidate_running"),
         ("recovered", "recovering"), ("install", "idle")]


def _end(world: World) -> tuple[object, ...]:
    doc = world.node.store.read()
    host = world.node.host
    sig = host.signal()
    return (doc.state, doc.pending is None, host.releases.selected(), host.releases.last_good(),
            None if sig is None else sig.to_version, host.gate.is_open(),
            tuple(sorted(world.assets_on_disk().items())))


def _count_ops(tmp_path: Path, trigger: str, source: str, monkeypatch: pytest.MonkeyPatch) -> int:
    world = make_world(tmp_path / "count")
    _to(source)(world)
    args = _args(trigger, world)
    layer = PowerLoss(world.root)
    layer.install(monkeypatch)
    world.node.controller.fire(trigger, **args)
    monkeypatch.undo()
    return layer.ops


@pytest.mark.parametrize(("trigger", "source"), CASES, ids=[c[0] for c in CASES])
def test_power_loss_at_every_operation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       trigger: str, source: str) -> None:
    """For each file operation N of the transition: cut the power before it, drop what was not
    durable, and check the state file and assets are each old or new, then that the next start
    (resuming or, if nothing was recorded, firing again) ends like an uninterrupted run."""
    reference = make_world(tmp_path / "ref")
    _to(source)(reference)
    before_assets = reference.assets_on_disk()
    before_state = reference.paths.state_file.read_bytes() if reference.paths.state_file.exists() \
        else None
    reference.node.controller.fire(trigger, **_args(trigger, reference))
    after_assets = reference.assets_on_disk()
    expected = _end(reference)

    total = _count_ops(tmp_path, trigger, source, monkeypatch)
    assert total > 3
    prepared = make_world(tmp_path / "prepared")
    _to(source)(prepared)
    args = _args(trigger, prepared)
    for n in range(1, total + 1):
        copy_tree(prepared.root, tmp_path / f"n{n}")
        world = make_world(tmp_path / f"n{n}")
        layer = PowerLoss(world.root, crash_at=n)
        layer.install(monkeypatch)
        with pytest.raises(Crash):
            world.node.controller.fire(trigger, **args)
        monkeypatch.undo()
        layer.lose_power()

        back = world.reopen()
        store: Store = back.node.store
        doc = store.read()  # never torn: it decodes, checksum and all
        if doc.pending is None:
            assert store.path.exists() or before_state is None
        for name, content in back.assets_on_disk().items():
            assert content in (before_assets[name], after_assets[name]), (n, name)
        if doc.state == source and doc.pending is None:
            back.node.controller.fire(trigger, **args)  # nothing was recorded: do it again
        else:
            back.node.controller.resume()
        assert _end(back) == expected, n
        COVERED.append(f"{trigger}:{n}")
