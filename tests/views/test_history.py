"""`history`: the transitions as a timeline of stays, filtered by upgrade, for people and JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_fsm.node.config import Config, Judgment
from agent_fsm.views.history import history, timeline
from tests.cli.test_cli import run
from tests.helpers import World, make_world

ENTRY_KEYS = {"time", "trigger", "from", "to", "release", "upgrade", "lasted_seconds", "current",
              "reason", "reason_class", "superseded_by", "unknown", "restarts", "first"}


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text('name = "agent"\n[judgment]\ndeadline_seconds = 60\nsoak_seconds = 5\n')
    return path


def good_then_failed(world: World) -> World:
    """1.0.0 installed; a good upgrade to 2.0.0; a failed one to 3.0.0, rolled back."""
    c = world.node.controller
    world.installed("1.0.0")
    world.clock.advance(10)
    world.upgrading("2.0.0")
    world.clock.advance(3)
    c.fire("judge_ok")
    world.clock.advance(1)
    c.fire("complete")
    world.clock.advance(20)
    world.upgrading("3.0.0")
    world.clock.advance(7)
    c.fire("judge_failed")
    world.clock.advance(2)
    c.fire("recover")
    world.clock.advance(4)
    c.fire("recovered")
    world.clock.advance(30)
    return world


class TestTimeline:
    def test_each_stay_lasts_until_the_state_is_left(self, world: World) -> None:
        """A stay lasts from the transition into a state until the one out of it."""
        good_then_failed(world)
        rows = [(e.trigger, e.dest, e.lasted, e.current) for e in history(world.node).entries]
        assert rows == [
            ("install", "converged", 10.0, False),
            ("settle", "converged", None, False),  # a self-transition does not end the stay
            ("begin_upgrade", "candidate_running", 3.0, False),
            ("candidate_started", "candidate_running", None, False),
            ("judge_ok", "judged_ok", 1.0, False),
            ("complete", "converged", 20.0, False),
            ("begin_upgrade", "candidate_running", 7.0, False),
            ("candidate_started", "candidate_running", None, False),
            ("judge_failed", "judged_failed", 2.0, False),
            ("recover", "recovering", 4.0, False),
            ("recovered", "converged", 30.0, True),  # still going on: so far
        ]

    def test_versions_of_each_transition(self, world: World) -> None:
        """Entries of an upgrade name its versions; an install names its release."""
        good_then_failed(world)
        entries = history(world.node).entries
        assert entries[0].release == "1.0.0" and entries[0].upgrade is None
        assert entries[2].upgrade == ("1.0.0", "2.0.0")
        assert entries[-1].upgrade == ("2.0.0", "3.0.0")

    def test_filter_by_upgrade(self, world: World) -> None:
        """upgrade= keeps only the transitions of upgrades to that version."""
        good_then_failed(world)
        h = history(world.node, upgrade="3.0.0")
        assert [e.trigger for e in h.entries] == [
            "begin_upgrade", "candidate_started", "judge_failed", "recover", "recovered"]
        assert history(world.node, upgrade="9.9.9").entries == ()

    def test_limit_keeps_the_latest(self, world: World) -> None:
        """limit keeps the last N, after filtering; the stays are reckoned on all of history."""
        good_then_failed(world)
        h = history(world.node, limit=2, upgrade="2.0.0")
        assert [(e.trigger, e.lasted) for e in h.entries] == [("judge_ok", 1.0),
                                                              ("complete", 20.0)]

    def test_empty_history(self, world: World) -> None:
        """A node that never moved has no entries and no current stay."""
        assert history(world.node).entries == ()
        assert timeline([], 0.0) == ()

    def test_trimmed_history_still_reckons_stays(self, tmp_path: Path) -> None:
        """With history_limit small, the oldest kept entry starts a stay; kept and limit shown."""
        world = make_world(tmp_path / "root", Config(name="agent", history_limit=3,
                                                     judgment=Judgment(deadline_seconds=60)))
        good_then_failed(world)
        h = history(world.node)
        assert (h.kept, h.limit) == (3, 3)
        assert [(e.trigger, e.lasted) for e in h.entries] == [
            ("judge_failed", 2.0), ("recover", 4.0), ("recovered", 30.0)]


class TestCommand:
    def test_json_entries_keep_their_keys(self, tmp_path: Path, cfg: Path) -> None:
        """history --json is a list, oldest first, each entry with the documented keys."""
        world = good_then_failed(make_world(tmp_path / "root"))
        proc = run("--config", str(cfg), "--root", str(world.root), "history", "--json")
        entries = json.loads(proc.stdout)
        assert all(set(e) == ENTRY_KEYS for e in entries)
        assert entries[0]["trigger"] == "install" and entries[0]["lasted_seconds"] == 10.0
        assert entries[2]["upgrade"] == {"from": "1.0.0", "to": "2.0.0"}

    def test_json_filter_and_limit(self, tmp_path: Path, cfg: Path) -> None:
        """--upgrade V --limit N --json gives the last N transitions of upgrades to V."""
        world = good_then_failed(make_world(tmp_path / "root"))
        proc = run("--config", str(cfg), "--root", str(world.root), "history", "--json",
                   "--upgrade", "3.0.0", "--limit", "2")
        assert [(e["trigger"], e["to"]) for e in json.loads(proc.stdout)] == [
            ("recover", "recovering"), ("recovered", "converged")]

    def test_human_timeline(self, tmp_path: Path, cfg: Path) -> None:
        """The table shows UTC times, triggers, from → to, versions and how long each stay was."""
        world = good_then_failed(make_world(tmp_path / "root"))
        proc = run("--config", str(cfg), "--root", str(world.root), "history",
                   "--upgrade", "3.0.0")
        assert proc.returncode == 0, proc.stderr
        text = proc.stdout
        assert "history of the upgrades to 3.0.0 (times in UTC)" in text
        row = next(line for line in text.splitlines() if "judge_failed" in line)
        assert "2023-11-14" in row and "candidate_running → judged_failed" in row
        assert "2.0.0 → 3.0.0" in row and "2.0s" in row
        assert "install" not in text
        assert "\x1b[" not in text

    def test_nothing_matches(self, tmp_path: Path, cfg: Path) -> None:
        """A filter that matches nothing says so, with how much history is kept, and exits 0."""
        world = good_then_failed(make_world(tmp_path / "root"))
        proc = run("--config", str(cfg), "--root", str(world.root), "history", "--upgrade", "7")
        assert proc.returncode == 0
        assert "no transitions of an upgrade to 7 in the kept history (11 kept, at most 200)" \
            in proc.stdout

    def test_limit_must_be_positive(self, tmp_path: Path, cfg: Path) -> None:
        """--limit 0 is a usage error (exit 2)."""
        proc = run("--config", str(cfg), "--root", str(tmp_path), "history", "--limit", "0")
        assert proc.returncode == 2
