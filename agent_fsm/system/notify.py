"""sd_notify: one datagram to `$NOTIFY_SOCKET` (a leading '@' is the abstract namespace).

No library: the protocol is a single `sendto`. Outside systemd (no socket), it does nothing.
"""

from __future__ import annotations

import os
import socket

from ..untrusted import shown

MAX_STATUS = 1000  # characters of `STATUS=` (what `systemctl status` shows)


def _status(text: str) -> str:
    """`STATUS=text` as one line, control characters visible: a line break would start a field of
    its own (`READY=1`, `MAINPID=`)."""
    return f"STATUS={shown(text, MAX_STATUS)}"


class Notifier:
    def __init__(self, address: str | None = None) -> None:
        self.address = address if address is not None else os.environ.get("NOTIFY_SOCKET")

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, *fields: str) -> bool:
        """Send `FIELD=value` lines in one datagram; False when there is no socket or it fails."""
        if not self.address:
            return False
        target = self.address
        if target.startswith("@"):
            target = "\0" + target[1:]
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            try:
                sock.connect(target)
                sock.sendall("\n".join(fields).encode())
            except OSError:
                return False
        return True

    def ready(self, status: str) -> bool:
        return self.send("READY=1", _status(status))

    def status(self, status: str) -> bool:
        return self.send(_status(status))

    def extend_timeout(self, seconds: float, status: str) -> bool:
        """Ask for `seconds` more before the current start (or stop) times out."""
        return self.send(f"EXTEND_TIMEOUT_USEC={int(seconds * 1_000_000)}", _status(status))

    def stopping(self) -> bool:
        return self.send("STOPPING=1", "STATUS=stopping")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")


def watchdog_interval() -> float | None:
    """Half of systemd's watchdog timeout, for this process; None when there is none."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 2_000_000
    except ValueError:
        return None
