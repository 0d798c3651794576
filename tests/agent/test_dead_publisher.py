"""A dead publisher has a bounded way out: once publishing a judged-ok result
has failed for `publish_give_up_seconds`, `complete_queued` queues it in the outbox, recorded as
such, and the gate opens; a publisher that answers within the bound keeps `complete`'s order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_fsm.actions.recover import recover
from agent_fsm.actions.upgrade import begin_upgrade
from agent_fsm.agent.daemon import Daemon, Waker
from agent_fsm.agent.publishing import open_gate_after_judgment
from agent_fsm.errors import ConfigError, PublishError
from agent_fsm.node import config as config_mod
from agent_fsm.node.state.validate import RESULT
from agent_fsm.system.notify import Notifier
from agent_fsm.system.publish import RecordPublisher, Result
from tests.helpers import World

BOUND = 60.0


def _judged_ok(world: World) -> float:
    """Node upgraded to 2.0.0 and judged ok with the publisher down; the judgment's time."""
    world.installed("1.0.0")
    world.upgrading("2.0.0")
    world.publisher.failures = 1000
    world.node.controller.fire("judge_ok")
    since = world.node.store.read().since
    assert since is not None
    return since


def _give_up(world: World, bound: float = BOUND) -> None:
    # `max_tries` turns a missing way out into a PublishError instead of a test that never ends.
    open_gate_after_judgment(world.node.controller, world.clock, max_tries=200,
                             give_up_after=bound, monotonic=world.clock.now)


class TestGivingUp:
    def test_the_gate_opens_within_the_bound_with_the_result_queued(self, world: World) -> None:
        """With every publish failing, the node converges on the candidate with the gate open
        and the signal cleared once the bound has passed, not later, and the ok result waits
        in the outbox marked with since when the publisher was unreachable."""
        since = _judged_ok(world)
        _give_up(world)
        doc = world.node.store.read()
        assert doc.state == "converged" and doc.pending is None
        assert world.node.gate.is_open() and world.node.signal() is None
        assert world.node.releases.selected() == world.node.releases.last_good() == "2.0.0"
        assert world.assets_on_disk() == world.rendered("2.0.0")
        assert world.clock.now() - since == pytest.approx(BOUND)  # slept up to the bound, no more
        assert doc.last_result is not None and doc.last_result["outcome"] == "ok"
        assert doc.last_result["publisher_unreachable_since"] == since
        assert "queued in the outbox" in doc.last_result["reason"]
        assert "injected failure" in doc.last_result["reason"]
        assert [r.to_version for r in world.publisher.queue] == ["2.0.0"]
        assert world.publisher.published == []

    def test_the_history_says_the_result_was_queued(self, world: World) -> None:
        """The history shows `complete` superseded by `complete_queued`, which reached
        converged with the reason saying the result was queued."""
        _judged_ok(world)
        _give_up(world)
        tail = world.node.store.history()[-2:]
        assert tail[0]["trigger"] == "complete" and tail[0]["superseded_by"] == "complete_queued"
        assert (tail[1]["trigger"], tail[1]["from"], tail[1]["to"]) == (
            "complete_queued", "judged_ok", "converged")
        assert tail[1]["reason_class"] == "passed" and "queued" in tail[1]["reason"]

    def test_a_publisher_answering_in_time_keeps_the_seed_order(self, world: World) -> None:
        """A publisher that fails a few times and then answers within the bound is waited
        for: `complete` runs, the result is delivered before the gate opens, nothing is
        marked queued."""
        _judged_ok(world)
        world.publisher.failures = 3
        _give_up(world, bound=600)
        doc = world.node.store.read()
        assert doc.state == "converged" and world.node.gate.is_open()
        assert [h["trigger"] for h in world.node.store.history()][-1] == "complete"
        assert doc.last_result is not None and "publisher_unreachable_since" not in doc.last_result
        assert [r.to_version for r in world.publisher.published] == ["2.0.0"]

    def test_a_restart_after_the_bound_gives_up_at_the_first_failure(self, world: World) -> None:
        """The bound counts from the judgment, not from the daemon's start: a daemon started
        after the bound has passed tries once, then opens the gate without waiting again."""
        _judged_ok(world)
        world.clock.advance(BOUND + 5)  # the daemon was down meanwhile
        _give_up(world.reopen())
        assert world.node.store.read().state == "converged" and world.clock.sleeps == []
        assert world.publisher.attempts == 1

    def test_a_clock_stepped_back_does_not_stretch_the_bound(self, world: World) -> None:
        """The wall clock set back after the judgment does not delay the way out: the
        monotonic time of the retries bounds it too."""
        _judged_ok(world)
        world.clock.advance(-3600)
        ticks = iter(range(0, 10_000, 7))
        open_gate_after_judgment(world.node.controller, world.clock, max_tries=200,
                                 give_up_after=BOUND, monotonic=lambda: float(next(ticks)))
        assert world.node.store.read().state == "converged"
        assert world.publisher.attempts <= BOUND / 7 + 2

    def test_without_a_bound_it_keeps_trying(self, world: World) -> None:
        """`give_up_after=None` is the old rule: the gate stays shut while publishing fails."""
        _judged_ok(world)
        with pytest.raises(PublishError):
            open_gate_after_judgment(world.node.controller, world.clock, max_tries=30,
                                     monotonic=world.clock.now)
        assert world.node.store.read().state == "judged_ok" and not world.node.gate.is_open()

    def test_a_stop_ends_the_retries(self, world: World) -> None:
        """SIGTERM while retrying ends the loop at once: no more tries, the state unchanged
        (the next start goes on counting from the judgment)."""
        _judged_ok(world)
        doc = open_gate_after_judgment(world.node.controller, world.clock,
                                       give_up_after=BOUND, stopping=lambda: True)
        assert doc.state == "judged_ok" and world.publisher.attempts == 1

    def test_the_daemon_delivers_the_queued_result_once_the_publisher_answers(
            self, world: World, waker: Waker) -> None:
        """After the way out, the converged daemon's delivery loop sends the queued ok result
        once the publisher is back, with since when it was unreachable."""
        since = _judged_ok(world)
        _give_up(world)
        daemon = Daemon(world.node, Notifier(""), waker)
        assert daemon.deliver_results() is not None  # still down: retried later
        world.publisher.failures = 0
        assert daemon.deliver_results() is None
        [sent] = world.publisher.published
        assert (sent.to_version, sent.outcome, sent.publisher_unreachable_since) == (
            "2.0.0", "ok", since)

    def test_the_daemon_uses_the_configured_bound(self, world: World, waker: Waker) -> None:
        """The daemon's judged-ok path gives up after the config's `publish_give_up_seconds`."""
        from tests.helpers import make_world

        world = make_world(world.root, world.node.config._replace(publish_give_up_seconds=30),
                           world.systemd, world.publisher, world.clock)
        since = _judged_ok(world)
        daemon = Daemon(world.node, Notifier(""), waker)
        daemon.clock = world.clock  # type: ignore[assignment]  # sleeps advance the fake clock
        daemon.publish_and_open_gate()
        assert world.node.store.read().state == "converged"
        assert world.node.store.history()[-1]["trigger"] == "complete_queued"
        assert 30 <= world.clock.now() - since <= 30 + 1


class TestTheWayOutKeepsTheOrder:
    def test_signal_cleared_then_assets_then_reload_then_promotion_and_gate(
            self, world: World) -> None:
        """`complete_queued` keeps `complete`'s order after the result: at the reload the
        signal is gone and the candidate's assets are on disk, the gate still closed and the
        last-good not yet promoted; the gate opens last."""
        _judged_ok(world)
        seen: list[tuple[str, bool, bool, bool, str | None]] = []
        new = world.rendered("2.0.0")

        def look(verb: str, _unit: str) -> None:
            seen.append((verb, world.node.signal() is not None, world.assets_on_disk() == new,
                         world.node.gate.is_open(), world.node.releases.last_good()))

        world.systemd.on_call = look
        _give_up(world)
        assert seen == [("daemon-reload", False, True, False, "1.0.0")]
        assert world.node.gate.is_open() and world.node.releases.last_good() == "2.0.0"

    def test_a_forced_known_bad_version_is_cleared(self, world: World) -> None:
        """A version that had rolled back, upgraded to with `--force` and judged ok, is no
        longer known bad after the way out, as after `complete`."""
        from agent_fsm.node.records import known_bad

        world.installed("1.0.0")
        world.add_release("2.0.0")
        c = world.node.controller
        begin_upgrade(world.node, "2.0.0")
        c.fire("candidate_started")
        c.fire("judge_failed", reason="check failed", reason_class="check_failed")
        recover(world.node)
        c.fire("recovered")
        assert "2.0.0" in known_bad.read(world.paths.known_bad_file).marks
        begin_upgrade(world.node, "2.0.0", force=True)
        c.fire("candidate_started")
        world.publisher.failures = 1000
        c.fire("judge_ok")
        _give_up(world)
        assert world.node.store.read().state == "converged"
        assert known_bad.read(world.paths.known_bad_file).marks == {}


class TestTheQueuedResult:
    def test_the_published_json_carries_since_when(self, tmp_path: Path) -> None:
        """The publish command gets `publisher_unreachable_since` in the result's JSON, and
        the outbox's document format accepts it."""
        out = tmp_path / "got.json"
        cmd = tmp_path / "publish"
        cmd.write_text(f"#!/bin/sh\ncat > {out}\n")
        cmd.chmod(0o755)
        publisher = RecordPublisher(tmp_path / "results", (str(cmd),), document=RESULT)
        publisher.publish(Result("1.0.0", "2.0.0", "ok", 100.0, 200.0, "queued", "passed", 150.0))
        assert json.loads(out.read_text())["publisher_unreachable_since"] == 150.0

    def test_an_ordinary_result_has_no_such_key(self) -> None:
        """A result published in time says nothing about an unreachable publisher."""
        assert "publisher_unreachable_since" not in Result("1.0.0", "2.0.0", "ok", 1.0,
                                                           2.0).to_json()


class TestTheSetting:
    def test_the_default_is_ten_minutes(self) -> None:
        """Unset, a dead publisher holds the gate at most 600 s (docs/configuration.md)."""
        assert config_mod.Config().publish_give_up_seconds == 600.0

    def test_a_value_is_read(self, tmp_path: Path) -> None:
        """`publish_give_up_seconds = 5` is taken as 5 seconds."""
        assert config_mod.parse({"publish_give_up_seconds": 5}, tmp_path / "c.toml"
                                ).publish_give_up_seconds == 5.0

    @pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan"), "600", True,
                                       8 * 86400])
    def test_a_wrong_value_is_refused_with_the_range(self, tmp_path: Path, value: object) -> None:
        """Zero, negative, infinite, non-numeric or over a week: refused, naming the key and
        the range (there is no "never": the way out is always bounded)."""
        with pytest.raises(ConfigError, match=r"`publish_give_up_seconds` is .*above 0, at most"):
            config_mod.parse({"publish_give_up_seconds": value}, tmp_path / "c.toml")
