"""sd_notify over a real datagram socket, by path and in the abstract namespace; the journal's
lines."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from agent_fsm.system.notify import Notifier, watchdog_interval


def _receiver(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + address[1:] if address.startswith("@") else address)
    sock.settimeout(5)
    return sock


class TestNotifier:
    @pytest.mark.parametrize("kind", ["path", "abstract"])
    def test_ready_is_one_datagram(self, tmp_path: Path, kind: str) -> None:
        """READY=1 and STATUS= arrive together in one datagram, by path or abstract address."""
        address = str(tmp_path / "notify") if kind == "path" else f"@agent-fsm-test-{os.getpid()}"
        with _receiver(address) as sock:
            assert Notifier(address).ready("gate open")
            assert sock.recv(4096) == b"READY=1\nSTATUS=gate open"
            assert Notifier(address).stopping()
            assert sock.recv(4096) == b"STOPPING=1\nSTATUS=stopping"

    def test_a_status_is_one_field_whatever_it_quotes(self, tmp_path: Path) -> None:
        """A status quoting text with a line break (a check's answer) stays one `STATUS=` field:
        its `MAINPID=1` line is not a field systemd would act on."""
        address = str(tmp_path / "notify")
        with _receiver(address) as sock:
            assert Notifier(address).status("judged failed: got \"x\nMAINPID=1\x1b[2J\"")
            assert sock.recv(4096) == b'STATUS=judged failed: got "x\\nMAINPID=1\\x1b[2J"'

    def test_without_socket_nothing_is_sent(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Outside systemd there is no socket and notifying is a no-op."""
        monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
        assert Notifier().send("READY=1") is False

    def test_watchdog_interval_is_half_the_timeout(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """With WatchdogSec=10 the daemon pings every 5 s; another process's watchdog is ignored."""
        monkeypatch.setenv("WATCHDOG_USEC", "10000000")
        monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
        assert watchdog_interval() == 5.0
        monkeypatch.setenv("WATCHDOG_PID", "1")
        assert watchdog_interval() is None


class TestJournalLines:
    def test_a_logged_value_cannot_start_a_journal_entry(self) -> None:
        """A value quoted in a log message with a line break and a priority prefix stays on the
        message's line, written visibly: journald sees one entry, at the message's priority."""
        import logging

        from agent_fsm.agent.runtime import JournalFormatter

        record = logging.LogRecord("agent_fsm", logging.INFO, __file__, 1,
                                   "candidate judged failed: %s", ("x\n<0>fake\x1b[2J",), None)
        assert JournalFormatter().format(record) == \
            "<6>candidate judged failed: x\\n<0>fake\\x1b[2J"
