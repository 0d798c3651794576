"""`release prune`: never removes what the way back or an owed transition needs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_fsm.actions.recover import recover
from agent_fsm.actions.releases.pruning import prune
from agent_fsm.errors import StateFileError
from tests.helpers import Crash, World, crash_at, make_world, one_line

ROOT = Path(__file__).resolve().parents[2]




def _crashed(world: World, trigger: str, release: str, index: int) -> World:
    """Fire `trigger` and crash before its effect `index`; return the world after a restart."""
    world.node.controller.failpoint = crash_at(trigger, index)
    with pytest.raises(Crash):
        world.node.controller.fire(trigger, release=release)
    after = world.reopen()
    pending = after.node.store.read().pending
    assert pending is not None and pending.trigger == trigger and pending.done == index
    return after


def _before(world: World, trigger: str, effect: str) -> int:
    """The index of `effect` in `trigger`'s declared effects."""
    effects = [e.name for e in world.node.definition.transition(trigger).effects]
    return effects.index(effect)


def _cli(world: World, *args: str) -> subprocess.CompletedProcess[str]:
    cfg = world.root.parent / "config.toml"
    cfg.write_text('name = "agent"\n[judgment]\ndeadline_seconds = 60\nsoak_seconds = 5\n')
    env = {k: v for k, v in os.environ.items() if k != "AGENT_FSM_CONFIG"}
    env["COLUMNS"] = "200"
    return subprocess.run([sys.executable, "-m", "agent_fsm", "--config", str(cfg), "--root",
                           str(world.root), "release", "prune", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=60, check=False)


class TestPrune:
    def test_interrupted_begin_upgrade_keeps_candidate_then_resumes(self, tmp_path: Path) -> None:
        """A begin_upgrade cut short before select_release keeps its candidate, and resume ends it."""
        # A downgrade candidate (older than the selected): only the owed transition names it.
        probe = make_world(tmp_path / "probe")
        for index in range(_before(probe, "begin_upgrade", "select_release") + 1):
            world = make_world(tmp_path / f"root{index}").installed("2.0.0")
            world.add_release("1.0.0")
            world.add_release("1.5.0")
            after = _crashed(world, "begin_upgrade", "1.5.0", index)
            assert after.node.releases.selected() == "2.0.0"
            result = prune(after.node)
            assert result.removed == ("1.0.0",), index
            assert "owed by an interrupted begin_upgrade" in dict(result.kept)["1.5.0"]
            doc = after.node.controller.resume()
            assert (doc.state, doc.pending) == ("candidate_running", None)
            assert after.node.releases.selected() == "1.5.0"
            sig = after.node.signal()
            assert sig is not None and (sig.from_version, sig.to_version) == ("2.0.0", "1.5.0")

    def test_interrupted_activate_keeps_its_release_then_resumes(self, world: World) -> None:
        """An activate cut short before select_release keeps its release, and resume ends it."""
        world.installed("2.0.0")
        world.add_release("0.9.0")
        world.add_release("1.0.0")
        after = _crashed(world, "activate", "1.0.0",
                         _before(world, "activate", "select_release"))
        result = prune(after.node)
        assert result.removed == ("0.9.0",)
        assert dict(result.kept) == {"1.0.0": ("owed by an interrupted activate",),
                                     "2.0.0": ("selected", "last-good",
                                               "owed by an interrupted activate")}
        doc = after.node.controller.resume()
        assert (doc.state, doc.pending) == ("converged", None)
        releases = after.node.releases
        assert (releases.selected(), releases.last_good()) == ("1.0.0", "1.0.0")

    def test_newer_staged_release_kept_older_unused_removed(self, world: World) -> None:
        """By default a release newer than the selected is kept as staged; an older one goes."""
        world.installed("2.0.0")
        for v in ("1.0.0", "3.0.0", "10.0.0"):  # 10.0.0 is newer, though it sorts first as text
            world.add_release(v)
        result = prune(world.node)
        assert result.removed == ("1.0.0",)
        assert dict(result.kept) == {"2.0.0": ("selected", "last-good"),
                                     "3.0.0": ("staged: newer than the selected 2.0.0",),
                                     "10.0.0": ("staged: newer than the selected 2.0.0",)}
        assert world.node.releases.versions() == ["10.0.0", "2.0.0", "3.0.0"]

    def test_a_known_bad_release_is_not_staged(self, world: World) -> None:
        """By default a release that rolled back here goes, newer than the selected or not, as
        the dry run says first; a newer one not known bad stays staged."""

        world.installed("1.0.0").upgrading("2.0.0")
        world.node.controller.fire("judge_failed", reason="checks failing",
                                   reason_class="check_failed")
        recover(world.node)
        world.node.controller.fire("recovered")
        world.add_release("3.0.0")
        dry = _cli(world, "--dry-run")
        assert dry.returncode == 0 and "would remove 2.0.0" in dry.stdout.splitlines(), dry.stdout
        result = prune(world.node)
        assert result.removed == ("2.0.0",)
        assert dict(result.kept)["3.0.0"] == ("staged: newer than the selected 1.0.0",)

    def test_keep_n_keeps_the_n_newest_besides_the_protected(self, world: World) -> None:
        """`--keep 1` keeps the protected and the newest other, removing staged ones beyond it."""
        world.add_release("1.0.0")
        world.installed("2.0.0")
        for v in ("3.0.0", "10.0.0"):
            world.add_release(v)
        dry = _cli(world, "--keep", "1", "--dry-run")
        assert dry.returncode == 0, dry.stderr
        *lines, freed = dry.stdout.splitlines()
        assert lines == ["would remove 1.0.0", "kept 2.0.0 (selected, last-good)",
                         "would remove 3.0.0", "kept 10.0.0 (within --keep 1)"]
        assert freed.startswith("would free ") and freed.endswith(" KiB"), freed
        assert world.node.releases.versions() == ["1.0.0", "10.0.0", "2.0.0", "3.0.0"]
        proc = _cli(world, "--keep", "1", "--json")
        assert proc.returncode == 0, proc.stderr
        said = json.loads(proc.stdout)
        assert said.pop("freed_bytes") > 0
        assert said == {
            "removed": ["1.0.0", "3.0.0"], "dry_run": False,
            "kept": [{"version": "2.0.0", "why": ["selected", "last-good"]},
                     {"version": "10.0.0", "why": ["within --keep 1"]}]}
        assert world.node.releases.versions() == ["10.0.0", "2.0.0"]
        zero = _cli(world, "--keep", "0")
        assert zero.stdout.splitlines()[:-1] == ["kept 2.0.0 (selected, last-good)",
                                                 "removed 10.0.0"]
        assert zero.stdout.splitlines()[-1].startswith("freed ")
        assert world.node.releases.versions() == ["2.0.0"]

    def test_named_versions_removed_protected_refused_with_exit_3(self, world: World) -> None:
        """Named releases are removed exactly; naming a protected one refuses all with exit 3."""
        world.add_release("0.9.0")
        world.installed("1.0.0").upgrading("2.0.0")
        world.add_release("3.0.0")
        refused = _cli(world, "3.0.0", "1.0.0")
        assert refused.returncode == 3
        line = one_line(refused)
        assert line.startswith("agent-fsm: will not remove 1.0.0 (last-good, pending upgrade)")
        assert "nothing was removed" in line
        assert world.node.releases.versions() == ["0.9.0", "1.0.0", "2.0.0", "3.0.0"]
        assert _cli(world, "2.0.0").returncode == 3
        assert _cli(world, "--keep", "1", "0.9.0").returncode == 2
        missing = _cli(world, "4.0.0")
        assert missing.returncode == 1 and "4.0.0 is not stored" in one_line(missing)
        proc = _cli(world, "3.0.0", "0.9.0")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.splitlines()[:-1] == [
            "removed 0.9.0", "kept 1.0.0 (last-good, pending upgrade)",
            "kept 2.0.0 (selected, pending upgrade)", "removed 3.0.0"]
        assert proc.stdout.splitlines()[-1].startswith("freed ")
        assert world.node.releases.versions() == ["1.0.0", "2.0.0"]

    def test_damaged_state_file_refuses_and_removes_nothing(self, world: World) -> None:
        """With a damaged state file prune refuses (exit 1, one line) and removes nothing."""
        world.installed("2.0.0")
        world.add_release("1.0.0")
        state = world.paths.state_file
        damaged = state.read_bytes().replace(b'"converged"', b'"convergex"', 1)
        assert damaged != state.read_bytes()
        state.write_bytes(damaged)
        with pytest.raises(StateFileError, match="checksum"):
            prune(world.node)
        proc = _cli(world)
        assert proc.returncode == 1 and str(state) in one_line(proc)
        assert world.node.releases.versions() == ["1.0.0", "2.0.0"]
        assert state.read_bytes() == damaged
