"""Results go to a local outbox first: recording is durable and never blocks the way back;
delivering (the publish command) is retried apart from the transitions."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from agent_fsm.agent.daemon import Daemon, Waker
from agent_fsm.agent.publishing import open_gate_after_judgment
from agent_fsm.errors import PublishError
from agent_fsm.node.state.validate import RESULT
from agent_fsm.system.notify import Notifier
from agent_fsm.system.publish import RecordPublisher, Result
from tests.helpers import World

BROKEN_UNIT = "[Service]\nExecStart=/nonexistent\n"


class TestWayBackIgnoresThePublisher:
    def test_rollback_completes_with_the_publisher_down(self, world: World) -> None:
        """With every delivery failing, judge_failed, recover and recovered all complete: the
        node is back on the last-good with the gate open and the result recorded, not lost."""
        world.installed("1.0.0")
        world.upgrading("2.0.0", agent_unit=BROKEN_UNIT)
        world.publisher.failures = 1000
        for trigger in ("judge_failed", "recover", "recovered"):
            world.node.controller.fire(trigger)
        doc = world.node.store.read()
        assert doc.state == "converged" and world.node.gate.is_open()
        assert world.node.releases.selected() == "1.0.0"
        assert doc.last_result is not None and doc.last_result["outcome"] == "rolled_back"
        assert world.publisher.attempts == 0 and world.publisher.published == []
        assert [r.outcome for r in world.publisher.queue] == ["rolled_back"]

    def test_last_good_daemon_delivers_the_rolled_back_result(self, world: World,
                                                              waker: Waker) -> None:
        """The last-good's daemon delivers the queued result once the publisher answers, and
        a failed try neither stops the daemon nor closes the gate."""
        world.installed("1.0.0")
        world.upgrading("2.0.0", agent_unit=BROKEN_UNIT)
        world.node.controller.fire("recover")
        world.node.controller.fire("recovered")
        daemon = Daemon(world.node, Notifier(""), waker)
        world.publisher.failures = 1
        assert daemon.deliver_results() is not None  # failed: a retry is scheduled
        assert world.node.gate.is_open() and world.publisher.published == []
        assert daemon.deliver_results() is None
        assert [r.outcome for r in world.publisher.published] == ["rolled_back"]
        assert daemon.deliver_results() is None and world.publisher.attempts == 2

    def test_delivery_retries_back_off(self, world: World, waker: Waker) -> None:
        """Failing deliveries are retried further and further apart, up to a bound."""
        world.installed("1.0.0")
        world.upgrading("2.0.0")
        world.node.controller.fire("recover")
        world.publisher.failures = 1000
        daemon = Daemon(world.node, Notifier(""), waker)
        delays = [daemon.deliver_results() for _ in range(12)]
        assert delays[:3] == [1.0, 2.0, 4.0] and delays[-1] == 300.0


class TestJudgedOkKeepsTheSeedOrder:
    def test_a_slow_publisher_extends_the_start_timeout_before_each_try(
            self, world: World, tmp_path: Path, waker: Waker) -> None:
        """While the judged-ok result is retried, the daemon asks systemd for more start time
        before every try and says why in STATUS=, so a slow publisher never becomes a
        rollback; the gate opens only once it is delivered."""
        world.installed("1.0.0")
        world.upgrading("2.0.0")
        world.node.controller.fire("judge_ok")
        world.publisher.failures = 2
        address = str(tmp_path / "notify.sock")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        server.bind(address)
        server.settimeout(1)
        daemon = Daemon(world.node, Notifier(address), waker)
        open_gate_after_judgment(world.node.controller, world.clock,
                                 before_try=daemon.extend_start)
        messages = [server.recv(4096).decode() for _ in range(3)]
        server.close()
        assert all(m.startswith("EXTEND_TIMEOUT_USEC=") for m in messages)
        assert "injected failure" in messages[2] and "try 3" in messages[2]
        assert world.node.gate.is_open() and world.publisher.attempts == 3

    def test_publish_delivers_an_older_queued_result_first(self, world: World) -> None:
        """Delivery is in order: a rolled-back result still queued goes out before the next
        upgrade's ok result, and the gate waits for both."""
        world.installed("1.0.0")
        world.publisher.failures = 1000
        world.upgrading("2.0.0", agent_unit=BROKEN_UNIT)
        for trigger in ("recover", "recovered"):
            world.node.controller.fire(trigger)
        world.publisher.failures = 0
        world.add_release("3.0.0")
        world.node.controller.fire("begin_upgrade", release="3.0.0")
        world.node.controller.fire("candidate_started")
        world.node.controller.fire("judge_ok")
        world.node.controller.fire("complete")
        assert [(r.to_version, r.outcome) for r in world.publisher.published] == [
            ("2.0.0", "rolled_back"), ("3.0.0", "ok")]


class TestRecordPublisher:
    def _publisher(self, tmp_path: Path, script: str) -> RecordPublisher:
        cmd = tmp_path / "publish"
        cmd.write_text("#!/bin/sh\n" + script)
        cmd.chmod(0o755)
        return RecordPublisher(tmp_path / "state" / "results", (str(cmd),), timeout=5,
                               document=RESULT)

    def test_without_a_command_nothing_is_said_delivered(
            self, world: World, waker: Waker, caplog: pytest.LogCaptureFixture) -> None:
        """With no publish_command, the daemon's delivery empties the outbox and logs no
        "delivered N result(s)": there was nowhere to deliver to."""
        world.installed("1.0.0")
        pub = RecordPublisher(world.paths.results_dir, (), outbox=world.paths.outbox_dir,
                              document=RESULT)
        world.node.effectors.publisher = pub
        pub.record(Result("1.0.0", "2.0.0", "rolled_back", 1_700_000_000.5, 1_700_000_010.0))
        assert len(pub.queued()) == 1
        with caplog.at_level("INFO"):
            assert Daemon(world.node, Notifier(""), waker).deliver_results() is None
        assert pub.queued() == [] and pub.deliver() == 0
        assert "delivered" not in caplog.text, caplog.text

    def test_record_is_local_and_durable_and_delivery_empties_the_outbox(
            self, tmp_path: Path) -> None:
        """record() writes the result and queues it without running the command; deliver()
        runs the command with the JSON on stdin, and the outbox empties only when it exits 0."""
        sink = tmp_path / "sink"
        flag = tmp_path / "up"
        pub = self._publisher(tmp_path, f'test -e {flag} || exit 7\ncat >> {sink}\n')
        result = Result("1.0.0", "2.0.0", "rolled_back", 1_700_000_000.5, 1_700_000_010.0)
        pub.record(result)
        assert json.loads(pub.record_path(result).read_text())["outcome"] == "rolled_back"
        assert len(pub.queued()) == 1 and not sink.exists()
        with pytest.raises(PublishError, match="exited 7"):
            pub.deliver()
        assert len(pub.queued()) == 1
        flag.touch()
        assert pub.deliver() == 1
        assert pub.queued() == [] and json.loads(sink.read_text())["to"] == "2.0.0"
