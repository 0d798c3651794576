"""The daemon process's plumbing: journald priority prefixes, and sleeps that a signal ends.

Signal handlers only set flags and write to a wake-up pipe (`signal.set_wakeup_fd`), so an idle
daemon sleeps in one `select` and wakes for a signal, a child's exit or its own timeout.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import sys
import time
from types import FrameType

from ..untrusted import shown

MAX_LOG = 4000  # characters of one journal line
PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3,
            logging.CRITICAL: 2}


class JournalFormatter(logging.Formatter):
    """`<N>message`: journald reads the priority from the prefix. The message is one line, control
    characters visible: a quoted line break would start an entry with a priority of its choosing."""

    def format(self, record: logging.LogRecord) -> str:
        return f"<{PRIORITY.get(record.levelno, 6)}>{shown(record.getMessage(), MAX_LOG)}"


def setup_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JournalFormatter())
    root = logging.getLogger("agent_fsm")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False


def return_free_memory() -> None:
    """Give the C heap's free pages back (glibc's `malloc_trim`) once the start's work is done:
    glibc keeps what the start freed below its heap's top (~1.2 MB measured in the daemon, for 0.4
    MB of `ctypes`). A no-op without glibc."""
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (ImportError, OSError, AttributeError):
        pass  # not glibc, or no ctypes: the memory is only kept, never wrong


class Waker:
    """Sleeps that end early on a signal: handlers write to a pipe (set_wakeup_fd)."""

    def __init__(self) -> None:
        self.stop = False
        self.child = False
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGCHLD, self._on_child)

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stop = True

    def _on_child(self, signum: int, frame: FrameType | None) -> None:
        self.child = True

    def wait(self, timeout: float | None, also: int | None = None) -> None:
        """Sleep `timeout` seconds (None: until woken), less when a signal comes or the
        descriptor `also` is readable."""
        if self.stop:
            return
        fds = [self._r] if also is None else [self._r, also]
        ready, _, _ = select.select(fds, [], [], timeout)
        if self._r in ready:
            try:
                while os.read(self._r, 512):
                    pass
            except BlockingIOError:
                pass


class WakerClock:
    """The system clock, with sleeps that end at once on SIGTERM. `now` is the wall clock (what the
    state file records); the judgment measures on `monotonic`, which wall-clock steps never move."""

    def __init__(self, waker: Waker) -> None:
        self.waker = waker

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self.waker.stop and (left := end - time.monotonic()) > 0:
            self.waker.wait(left)
