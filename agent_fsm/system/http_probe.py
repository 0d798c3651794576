"""An HTTP(S) health check: one GET, in-process, bounded by a timeout.

A redirect is not followed: its status is what the check sees, since a health endpoint that moves is
a finding. No proxy from the environment is used (a check names the node's own service); https is
verified against the system's CA store. Standard library only, imported when a check runs: a daemon
without HTTP checks never loads it, nor OpenSSL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ..untrusted import quoted

if TYPE_CHECKING:
    from email.message import Message
    from http.client import HTTPException

_SNIPPET = 200  # bytes of a failing answer's body read for the reason
_QUOTED = 100  # characters of the server's own words (a Location, a line of its body) quoted


def get(url: str, expected: int, timeout: float) -> tuple[bool, str]:
    """GET `url` within `timeout` seconds: (passed, what came), passed when the status is
    `expected`.

    The whole GET is bounded, not only each connect and read, which a server answering a byte at a
    time would stretch. It runs on its own thread, given up at the timeout; its socket's timeout
    ends it soon after.
    """
    import threading

    done: list[tuple[bool, str]] = []
    worker = threading.Thread(target=lambda: done.append(_get(url, expected, timeout)),
                              name="http-check", daemon=True)
    worker.start()
    worker.join(timeout)
    if done:
        return done[0]
    return False, f"GET {url}: expected {expected}, got no answer within {timeout:g}s (timeout)"


def _get(url: str, expected: int, timeout: float) -> tuple[bool, str]:
    import http.client
    import ssl
    import urllib.error
    import urllib.request

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *_: Any, **__: Any) -> None:
            return None  # the 3xx reaches the caller as it came

    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), NoRedirect(),
        urllib.request.HTTPSHandler(context=ssl.create_default_context()))
    request = urllib.request.Request(url, headers={"User-Agent": "agent-fsm-check"})
    what = f"GET {url}: expected {expected}, got"
    try:
        with opener.open(request, timeout=timeout) as answer:
            return _answered(url, expected, answer.status, answer.headers, answer)
    except urllib.error.HTTPError as exc:  # a status urllib calls an error: still an answer
        with exc:
            return _answered(url, expected, exc.code, exc.headers, exc)
    except urllib.error.URLError as exc:
        return False, f"{what} {_why(exc.reason, timeout)}"
    except http.client.HTTPException as exc:  # a status line or headers that are not HTTP
        return False, f"{what} {_malformed(exc)}"
    except (OSError, ValueError) as exc:  # a read timing out, a reset
        return False, f"{what} {_why(exc, timeout)}"


class _Body(Protocol):
    def read(self, size: int) -> bytes: ...


def _answered(url: str, expected: int, code: int, headers: Message,
              body: _Body) -> tuple[bool, str]:
    """The check's outcome for an answer with status `code`: agent-fsm's words, and the server's
    (its Location, its body's first line) quoted, bounded, control characters visible. Headers that
    break HTTP's syntax make it malformed, and it fails."""
    from http.client import HTTPException

    what = f"GET {url}: expected {expected}, got"
    wrong = _bad_headers(headers)
    if wrong is not None:
        return False, f"{what} a malformed answer ({wrong})"
    if code == expected:
        return True, f"GET {url} answered {code}"
    said = f"{code}"
    location = headers.get("Location")
    if 300 <= code < 400:
        said += f" (a redirect{f' to {quoted(location, _QUOTED)}' if location else ''}, " \
                "not followed)"
    try:
        start = body.read(_SNIPPET)
    except (OSError, ValueError, HTTPException):
        start = b""
    lines = start.decode("utf-8", "replace").strip().splitlines()
    return False, f"{what} {said}" + (f": {quoted(lines[0].strip(), _QUOTED)}" if lines else "")


def _bad_headers(headers: Message) -> str | None:
    """What breaks HTTP's header syntax in `headers` (strict: obsolete line folding too), or None.
    Folded lines would otherwise reach the reason as lines of their own."""
    if headers.defects:
        return "a header line that is not `name: value`"
    for name, value in headers.items():
        if "\r" in value or "\n" in value:
            return f"header {quoted(name, 40)} folded over lines, an obsolete syntax"
    return None


def _malformed(exc: HTTPException) -> str:
    """A malformed answer in agent-fsm's words; of the server's, only its first line, quoted."""
    from http.client import BadStatusLine, LineTooLong

    if isinstance(exc, LineTooLong):
        return "a malformed answer (a line of its headers was too long)"
    if isinstance(exc, BadStatusLine):
        line = str(exc.args[0]).rstrip("\r\n") if exc.args else ""
        return f"a malformed answer (its first line is not an HTTP status line: " \
               f"{quoted(line, _QUOTED)})"
    return f"a malformed answer ({type(exc).__name__})"


def _why(reason: object, timeout: float) -> str:
    """What a failed GET met, in a few words."""
    import ssl

    if isinstance(reason, TimeoutError) or str(reason) == "timed out":
        return f"no answer within {timeout:g}s (timeout)"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, ssl.SSLCertVerificationError):
        return f"a TLS error (certificate verify failed: {reason.verify_message})"
    if isinstance(reason, ssl.SSLError):
        return f"a TLS error ({reason})"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror.lower() if reason.errno else str(reason.strerror)
    return str(reason) or type(reason).__name__
