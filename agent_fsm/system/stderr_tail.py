"""A child's stderr read through a pipe: forwarded line by line to where it went before (the
journal), its last lines kept to say why the child exited.

Bounded in memory and time, and never a stall for the child: one thread reads the pipe as fast as
the child writes. A line over `MAX_PENDING` bytes is forwarded in pieces. Up to `MAX_PENDING` bytes
wait for a slow output. Past that, lines are dropped and counted in `dropped`, and a line says so
once the output takes lines again. The last `lines` lines are kept, each cut to `width` characters
(ending in "…").
"""

from __future__ import annotations

import os
import select
import threading
from collections import deque

MAX_PENDING = 64 * 1024  # bytes waiting for the output; past that, lines are dropped
READ = 64 * 1024
DROPPED = ("<4>agent-fsm: {} line(s) of this stderr were dropped here: the journal took them "
           "slower than they were written\n")  # a warning, in the journal's level prefix
FLUSH_WAIT = 1.0  # seconds the output is given to take what waits, once the child is done


class StderrTail:
    """Reads the pipe `read_fd` on its own thread, forwards every line to `output` and keeps the
    last ones. The child holds the write end, closed when it ends. `output` is a file descriptor. A
    copy is used, its blocking mode left alone, since the child's stdout may share it."""

    def __init__(self, read_fd: int, output: int, lines: int = 5, width: int = 200) -> None:
        self._read_fd, self._output = read_fd, os.dup(output)
        self._last: deque[str] = deque(maxlen=lines)
        self._width = width
        self._head = bytearray()  # the start of the line being read, as much as is kept
        self._line = bytearray()  # the rest of it not forwarded yet
        self._pending = bytearray()  # what `output` has not taken yet
        self.dropped = 0  # lines not forwarded: the output was too slow
        self._unsaid = 0  # of those, the ones no notice has said yet
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="stderr-tail", daemon=True)
        self._thread.start()

    def last_lines(self, wait: float = 1.0) -> list[str]:
        """The last lines the child wrote, oldest first, its unfinished last line included. Waits up
        to `wait` seconds for the pipe's end (every writer gone)."""
        self._thread.join(wait)
        with self._lock:
            last = list(self._last)
            if self._head:
                last = [*last, self._text(bytes(self._head))][-(self._last.maxlen or 1):]
            return last

    def _text(self, raw: bytes) -> str:
        text = raw.decode("utf-8", "replace")
        return text if len(text) <= self._width else text[:self._width - 1] + "…"

    def _run(self) -> None:
        try:
            while self._read_once():
                pass
            if self._line:
                self._forward(bytes(self._line) + b"\n")
            if self._unsaid:
                self._pending += DROPPED.format(self._unsaid).encode()
            self._flush(FLUSH_WAIT)
        finally:
            os.close(self._read_fd)
            os.close(self._output)

    def _read_once(self) -> bool:
        wanted = [self._output] if self._pending else []
        readable, writable, _ = select.select([self._read_fd], wanted, [])
        if writable:
            self._flush(0)
        if not readable:
            return True
        chunk = os.read(self._read_fd, READ)
        if not chunk:
            return False
        self._take(chunk)
        return True

    def _take(self, chunk: bytes) -> None:
        *ended, rest = chunk.split(b"\n")
        with self._lock:
            for piece in ended:
                self._add(piece)
                self._last.append(self._text(bytes(self._head)))
                self._forward(bytes(self._line) + b"\n")
                self._head.clear()
                self._line.clear()
            self._add(rest)
        self._flush(0)

    def _add(self, piece: bytes) -> None:
        keep = self._width * 4 - len(self._head)  # a character is at most 4 bytes of UTF-8
        if keep > 0:
            self._head += piece[:keep]
        self._line += piece
        while len(self._line) >= MAX_PENDING:  # a line without an end: forwarded in pieces
            self._forward(bytes(self._line[:MAX_PENDING]) + b"\n")
            del self._line[:MAX_PENDING]

    def _forward(self, line: bytes) -> None:
        if self._unsaid:  # the first line forwarded after some were dropped says so first
            notice = DROPPED.format(self._unsaid).encode()
            if len(self._pending) + len(notice) + len(line) <= MAX_PENDING:
                self._pending += notice
                self._unsaid = 0
        if self._unsaid or len(self._pending) + len(line) > MAX_PENDING:
            self.dropped += 1
            self._unsaid += 1
            return
        self._pending += line

    def _flush(self, wait: float) -> None:
        """Write what waits while `output` is ready, waiting up to `wait` for that. A pipe or socket
        that polls writable takes 4096 bytes without blocking."""
        while self._pending:
            _, writable, _ = select.select([], [self._output], [], wait)
            if not writable:
                return
            try:
                written = os.write(self._output, self._pending[:4096])
            except OSError:  # the output is gone: nothing more can be forwarded
                self._pending.clear()
                return
            del self._pending[:written]
