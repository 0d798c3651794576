"""HTTPS GETs of a channel's files, bounded in bytes and time.

TLS is checked against the system's CAs or a given bundle (`ssl.create_default_context`). Only https
is spoken, and a redirect is refused like any other unexpected answer: a static server serves the
files where the index says. Every read (TCP connect, TLS handshake, status line, headers, body) gets
what is left of the whole fetch's time. So a server that drips a byte a second is cut off at the
deadline. A download resumes (`Range:`) from the bytes a file holds.
"""

from __future__ import annotations

import functools
import http.client
import io
import os
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import ChannelError, Unreachable
from ..untrusted import shown

CHUNK = 256 << 10


def _context(ca: Path | None) -> ssl.SSLContext:
    try:
        return ssl.create_default_context(cafile=None if ca is None else str(ca))
    except (OSError, ssl.SSLError) as exc:
        raise ChannelError(f"cannot read the CA bundle {ca}: {exc}") from None


class _Deadline(io.RawIOBase):
    """A socket's reads, each bounded by what is left until `deadline` (TimeoutError after). Reads
    go through its own raw file, which keeps the socket open while the answer is read."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline = sock, deadline
        self.raw = sock.makefile("rb", buffering=0)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int | None:  # type: ignore[override]
        self.sock.settimeout(_left(self.deadline))
        return self.raw.readinto(buffer)

    def close(self) -> None:
        self.raw.close()
        super().close()


class _Response(http.client.HTTPResponse):
    """An answer read through `_Deadline`: a server that drips its headers is cut off too."""

    def __init__(self, sock: socket.socket, *args: object, deadline: float,
                 **kwargs: object) -> None:
        super().__init__(sock, *args, **kwargs)  # type: ignore[arg-type]
        self.fp.close()
        self.fp = io.BufferedReader(_Deadline(sock, deadline))


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    return left


class _Connection(http.client.HTTPSConnection):
    """An HTTPS connection whose TCP connect and TLS handshake share what is left until `deadline`.
    So a server slow to accept, then dripping its handshake, is cut off at the fetch's deadline."""

    def __init__(self, host: str, port: int | None, *, tls: ssl.SSLContext,
                 deadline: float) -> None:
        super().__init__(host, port, context=tls, timeout=_left(deadline))
        self.tls, self.deadline = tls, deadline

    def connect(self) -> None:
        self.timeout = _left(self.deadline)
        http.client.HTTPConnection.connect(self)  # TCP only: the handshake follows
        self.sock.settimeout(_left(self.deadline))
        self.sock = self.tls.wrap_socket(self.sock, server_hostname=self.host)


class _Get:
    """One GET: its answer's status and length, and its body in chunks until the deadline."""

    def __init__(self, url: str, *, ca: Path | None, seconds: float, offset: int = 0) -> None:
        parts = urlsplit(url)
        if parts.scheme != "https" or not parts.hostname:
            raise ChannelError(f"{shown(url)} is not an https:// URL")
        self.url, self.deadline = url, time.monotonic() + seconds
        self.conn = _Connection(parts.hostname, parts.port, tls=_context(ca),
                                deadline=self.deadline)
        self.conn.response_class = functools.partial(  # type: ignore[assignment]
            _Response, deadline=self.deadline)
        headers = {"User-Agent": "agent-fsm", "Accept-Encoding": "identity"}
        if offset:
            headers["Range"] = f"bytes={offset}-"
        path = parts.path or "/"
        try:
            self.conn.request("GET", path, headers=headers)
            self._bound()
            self.resp = self.conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise self._failed(exc) from None

    def _bound(self) -> None:
        left = _left(self.deadline)
        if self.conn.sock is not None:
            self.conn.sock.settimeout(left)

    def _failed(self, exc: BaseException) -> Unreachable:
        if isinstance(exc, TimeoutError | socket.timeout):
            why = "the server did not answer in time"
        elif isinstance(exc, ssl.SSLCertVerificationError):
            why = f"its TLS certificate is not trusted ({exc.verify_message})"
        else:
            why = str(exc) or type(exc).__name__
        return Unreachable(f"could not fetch {shown(self.url)}: {shown(why)}")

    def chunks(self, limit: int) -> Iterator[bytes]:
        """The body, at most `limit` bytes (ChannelError beyond), until the deadline."""
        got = 0
        try:
            while True:
                self._bound()
                chunk = self.resp.read1(CHUNK)
                if not chunk:
                    return
                got += len(chunk)
                if got > limit:
                    raise ChannelError(f"{shown(self.url)} is larger than {limit} bytes; refused")
                yield chunk
        except (OSError, http.client.HTTPException) as exc:
            raise self._failed(exc) from None

    def close(self) -> None:
        self.conn.close()


def get(url: str, *, ca: Path | None, limit: int, seconds: float) -> bytes | None:
    """The body of `url`, at most `limit` bytes, within `seconds` in all. None on a 404 (no such
    file); ChannelError when larger; Unreachable for any other failure; each in one line."""
    req = _Get(url, ca=ca, seconds=seconds)
    try:
        status = req.resp.status
        if status == 404:
            return None
        if status != 200:
            raise Unreachable(f"{shown(url)} answered {status} {shown(req.resp.reason)}")
        return b"".join(req.chunks(limit))
    finally:
        req.close()


def download(url: str, target: Path, *, ca: Path | None, size: int, seconds: float) -> None:
    """Fetch `url` into `target` (the caller's file in a private directory), resuming from the bytes
    it holds, until it holds `size` bytes. ChannelError if the server sends more; Unreachable if
    fewer or not within `seconds` (what arrived is kept for the next try)."""
    have = target.stat().st_size if target.exists() else 0
    if have > size:
        target.unlink()
        have = 0
    if have == size:
        return
    req = _Get(url, ca=ca, seconds=seconds, offset=have)
    try:
        status = req.resp.status
        if status == 200 and have:  # no range served: from the start again
            have = 0
        elif status not in (200, 206):
            raise Unreachable(f"{shown(url)} answered {status} {shown(req.resp.reason)}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | \
            (os.O_APPEND if have else os.O_TRUNC)
        fd = os.open(target, flags, 0o600)
        try:
            for chunk in req.chunks(size - have):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
        finally:
            os.close(fd)
    finally:
        req.close()
    if target.stat().st_size != size:
        raise Unreachable(f"{shown(url)} ended after {target.stat().st_size} of {size} bytes; "
                           "the next follow resumes it")
