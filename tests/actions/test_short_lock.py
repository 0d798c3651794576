"""The writers' lock is short: `release add` copies, digests and checks a release
(the ABI probe of the node's python, a signature) and `release prune` deletes trees and runs
`podman rmi` without it, taking it only to commit, so a transition of the way back never waits
behind an operator's command for longer than a commit."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent_fsm.actions.releases import abi
from agent_fsm.actions.releases.packing import add
from agent_fsm.actions.releases.pruning import prune
from tests.helpers import DEFAULT_CONFIG, World, make_world
from tests.node.test_release_store import make_release

FAKE_PODMAN = Path(__file__).resolve().parents[1] / "fake_podman.py"
WAIT = 20  # seconds a held-up process waits for the test at most (a bound, not a timing)


def _held_up(tmp_path: Path, name: str, then: str) -> tuple[Path, Path, Path]:
    """A stand-in for a slow process (a process boundary): it says it started (`started`),
    waits until the test lets it go on (`go`, at most WAIT s), then runs `then` with its
    arguments."""
    started, go = tmp_path / f"{name}.started", tmp_path / f"{name}.go"
    script = tmp_path / name
    script.write_text(f'#!/bin/sh\ntouch "{started}"\nn=0\n'
                      f'while [ ! -e "{go}" ] && [ $n -lt {WAIT * 50} ]; do sleep 0.02; '
                      f'n=$((n + 1)); done\nexec {then} "$@"\n')
    script.chmod(0o755)
    return script, started, go


def _meanwhile(world: World, slow: Callable[[], Any], started: Path, go: Path) -> Any:
    """Run `slow` in a thread; once the held-up process has started, fire a transition from
    another process's view of the node (its lock wait cut to 0.5 s), then let the process go
    on. Returns what `slow` returned; raises what the transition raised."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = slow()
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        for _ in range(WAIT * 50):
            if started.exists() or not thread.is_alive():
                break
            threading.Event().wait(0.02)
        assert started.exists(), out.get("error")
        other = world.reopen()
        other.node.store.lock_timeout = 0.5
        other.node.controller.fire("settle")  # Refused if the command held the lock
    finally:
        go.touch()
        thread.join(WAIT + 30)
    if "error" in out:
        raise out["error"]
    return out["result"]


def test_release_add_holds_no_lock_while_it_probes_the_python(tmp_path: Path) -> None:
    """While `release add` waits on the node's python (the ABI probe), a transition runs at
    once, and the add then stores the release."""
    python, started, go = _held_up(tmp_path, "python3", sys.executable)
    world = make_world(tmp_path / "root", DEFAULT_CONFIG._replace(python=python)).installed()
    release = make_release(tmp_path, "2.0.0")
    abi.record(release)  # a python.toml: the add asks the node's python
    added = _meanwhile(world, lambda: add(release, world.node), started, go)
    assert added.version == "2.0.0" and not added.already
    assert world.node.releases.exists("2.0.0")
    assert world.node.store.history()[-1]["trigger"] == "settle"


def test_prune_holds_no_lock_while_podman_removes_an_image(tmp_path: Path) -> None:
    """While `release prune` waits on `podman rmi`, a transition runs at once, and the prune
    then removes the release and its image."""
    state = tmp_path / "podman.json"
    image = "a" * 64
    state.write_text(json.dumps({"images": {image: {"names": [], "tree": str(tmp_path)}},
                                 "calls": [], "fail": {}, "busy": []}))
    podman, started, go = _held_up(tmp_path, "podman", f"{sys.executable} {FAKE_PODMAN} {state}")
    world = make_world(tmp_path / "root", DEFAULT_CONFIG._replace(podman=(str(podman),)))
    world.installed("1.0.0")
    world.add_release("0.9.0")
    records = world.paths.releases_dir / ".images"
    from agent_fsm.actions.releases import origins

    with world.node.store.locked():
        origins.remember(world.node, "0.9.0",
                         origins.Image("oci-archive:/x.tar", f"sha256:{image}", "", True))
    pruned = _meanwhile(world, lambda: prune(world.node), started, go)
    assert pruned.removed == ("0.9.0",)
    assert [v for v, _ in pruned.images.removed] == ["0.9.0"] and not pruned.images.failed
    assert not (records / "0.9.0").exists()
    assert world.node.store.history()[-1]["trigger"] == "settle"
