"""Power loss and crashes at every file operation of `release add` and `release prune` in the
store that keeps each byte once: no half release, every stored release intact, and
what the cut left (staging copies, trees taken out, objects no release links) freed by the next
add or prune."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from agent_fsm.actions.releases.packing import add
from agent_fsm.actions.releases.pruning import prune
from agent_fsm.node.releases import hashes as release_hashes
from agent_fsm.node.releases import objects as release_objects
from agent_fsm.node.releases import store as release_store
from tests.helpers import World, make_world
from tests.node.test_release_store import leftovers, make_release
from tests.reliability.powerloss import STORE_OPS, Crash, PowerLoss

COVERED: list[str] = []


def _prepared(root: Path, sources: Path) -> World:
    """1.0.0 and 2.0.0 stored (sharing their templates), 2.0.0 installed; 3.0.0's source ready."""
    world = make_world(root)
    for v in ("1.0.0", "2.0.0"):
        add(make_release(sources, v, marker=v), world.node)
    world.node.controller.fire("install", release="2.0.0")
    make_release(sources, "3.0.0")
    return world


def _copy(src: Path, dst: Path) -> None:
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True)  # keeps hard links


OPERATIONS: dict[str, tuple[Callable[[World, Path], object], set[str], set[str]]] = {
    # name: (run it, the releases before, the releases after)
    "add": (lambda w, src: add(src / "rel-3.0.0", w.node), {"1.0.0", "2.0.0"},
            {"1.0.0", "2.0.0", "3.0.0"}),
    "prune": (lambda w, src: prune(w.node), {"1.0.0", "2.0.0"}, {"2.0.0"}),
}


def _store(world: World) -> tuple[dict[str, str | None], list[str], list[str]]:
    """Each stored release's problem, what the store holds that no release uses, and the
    releases it keeps records for."""
    releases, where = world.node.releases, world.paths.releases_dir
    records = sorted(f"{d}/{p.name}" for d in (release_store.DIGESTS, release_hashes.HASHED)
                     for p in (where / d).glob("*"))
    return ({v: releases.integrity(v).problem for v in releases.versions()}, leftovers(world),
            records)


@pytest.mark.parametrize("power", [True, False], ids=["power-loss", "crash"])
@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_a_cut_at_every_operation_leaves_the_store_whole_and_the_next_run_frees_the_rest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, operation: str, power: bool) -> None:
    """For each file operation N of the add or prune (links, renames and directories
    included), and once after the last: the process dies before it (and, with `power`, what
    was not durable is dropped); every release then stored is whole and intact, and running
    the operation again ends as an uninterrupted run does, with nothing left that no release
    uses."""
    run, before, after = OPERATIONS[operation]
    sources = tmp_path / "src"
    prepared = _prepared(tmp_path / "prepared", sources)
    reference = tmp_path / "ref"
    _copy(prepared.root, reference)
    ref = make_world(reference)
    run(ref, sources)
    expected = _store(ref)
    assert expected[:2] == (dict.fromkeys(after), [])

    _copy(prepared.root, tmp_path / "count")
    count = make_world(tmp_path / "count")
    counting = PowerLoss(count.root, ops_counted=STORE_OPS)
    counting.install(monkeypatch)
    run(count, sources)
    monkeypatch.undo()
    total = counting.ops
    assert total > 10

    for n in range(1, total + 2):
        root = tmp_path / f"n{n}"
        _copy(prepared.root, root)
        world = make_world(root)
        layer = PowerLoss(root, crash_at=n, ops_counted=STORE_OPS, dies=True)
        layer.install(monkeypatch)
        if n <= total:
            with pytest.raises(Crash):
                run(world, sources)
        else:
            run(world, sources)
        monkeypatch.undo()
        if power:
            layer.lose_power()
        back = world.reopen()
        problems, *_ = _store(back)
        assert set(problems) in (before, after), n  # whole releases only, old or new
        assert not any(problems.values()), (n, problems)
        assert back.node.releases.selected() == "2.0.0"
        run(back, sources)
        assert _store(back) == expected, n
        objects = back.paths.releases_dir / release_objects.OBJECTS
        assert all(p.stat().st_nlink >= 2 for p in objects.iterdir()), n
        COVERED.append(f"{operation}:{n}")
