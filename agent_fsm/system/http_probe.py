"""An HTTP(S) health check: one GET, in-process, bounded by a timeout.

A redirect is not followed (its status is what the check sees: a health endpoint that moves is
a finding, not a hop to somewhere else); no proxy from the environment is used (a check names
the node's own service); https is verified against the system's CA store. The standard library
only, imported when a check runs: the daemon without HTTP checks never loads it (nor OpenSSL).
"""

from __future__ import annotations

from typing import Any

_SNIPPET = 200  # bytes of a failing answer's body quoted in the reason


def get(url: str, expected: int, timeout: float) -> tuple[bool, str]:
    """GET `url` within `timeout` seconds: (passed, what came), passed when the answer's status
    is `expected`. The whole GET is bounded, not only each connect and read (a server that
    answers a byte at a time would stretch those): it runs on a thread of its own, given up at
    the timeout (its socket's own timeout ends it soon after)."""
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
            code, body, location = answer.status, b"", None
            if code != expected:
                body = answer.read(_SNIPPET)
    except urllib.error.HTTPError as exc:  # a status urllib calls an error: still an answer
        with exc:
            code, location = exc.code, exc.headers.get("Location")
            try:
                body = exc.read(_SNIPPET) if code != expected else b""
            except (OSError, ValueError):
                body = b""
    except urllib.error.URLError as exc:
        return False, f"{what} {_why(exc.reason, timeout)}"
    except (OSError, ValueError) as exc:  # a read timing out, a reset, a malformed answer
        return False, f"{what} {_why(exc, timeout)}"
    if code == expected:
        return True, f"GET {url} answered {code}"
    said = f"{code}"
    if 300 <= code < 400:
        said += f" (a redirect{f' to {location}' if location else ''}, not followed)"
    text = body.decode("utf-8", "replace").strip().splitlines()
    return False, f"{what} {said}" + (f": {text[0]}" if text else "")


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
