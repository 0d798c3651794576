"""HTTP(S) checks against a real server on 127.0.0.1 in this process: what passes, and what a
failing one says in the judgment's reason (what was expected, what came)."""

from __future__ import annotations

import contextlib
import http.server
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent_fsm.agent.judge import judge, run_check
from agent_fsm.node.check_config import HttpCheck
from agent_fsm.node.config import Judgment
from agent_fsm.node.state import reasons
from agent_fsm.testing import FakeClock

pytestmark = pytest.mark.timeout(30)


class _Handler(http.server.BaseHTTPRequestHandler):
    hang = threading.Event()  # set at teardown: a hanging answer ends

    def do_GET(self) -> None:
        if self.path == "/hang":
            self.hang.wait(20)
            return
        if self.path == "/drip":  # a status line, then a byte at a time, never done
            self.wfile.write(b"HTTP/1.0 200 OK\r\n")
            while not self.hang.wait(0.1):
                self.wfile.write(b"X")
                self.wfile.flush()
            return
        code = {"/healthz": 200, "/down": 503, "/moved": 302}.get(self.path, 404)
        self.send_response(code)
        if code == 302:
            self.send_header("Location", "/healthz")
        self.end_headers()
        self.wfile.write(b"down for maintenance\n" if code == 503 else b"ok\n")

    def log_message(self, *_: object) -> None:
        pass


def _serve(server: http.server.ThreadingHTTPServer) -> Iterator[str]:
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        _Handler.hang.set()
        server.shutdown()
        server.server_close()
        thread.join(10)
        _Handler.hang.clear()


@pytest.fixture
def server() -> Iterator[str]:
    """host:port of an HTTP server answering /healthz 200, /down 503, /moved 302, /hang never."""
    yield from _serve(http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler))


@pytest.fixture
def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TestHttpCheck:
    def test_the_expected_status_passes(self, server: str) -> None:
        """A GET answered 200 passes a check expecting 200."""
        assert run_check(HttpCheck(f"http://{server}/healthz"), {}, 5) == (
            True, f"GET http://{server}/healthz answered 200")

    def test_another_status_fails_saying_both(self, server: str) -> None:
        """A 503 fails a check expecting 200, and the reason says both and the body's first
        line."""
        ok, why = run_check(HttpCheck(f"http://{server}/down"), {}, 5)
        assert not ok
        assert why == f'GET http://{server}/down: expected 200, got 503: "down for maintenance"'

    def test_the_status_asked_for_is_the_one_that_passes(self, server: str) -> None:
        """A check may expect another status: 503 expected, 503 passes and 200 fails."""
        assert run_check(HttpCheck(f"http://{server}/down", status=503), {}, 5)[0]
        assert not run_check(HttpCheck(f"http://{server}/healthz", status=503), {}, 5)[0]

    def test_a_redirect_is_not_followed(self, server: str) -> None:
        """A 302 to a healthy page fails (it is not followed), and the reason says so."""
        ok, why = run_check(HttpCheck(f"http://{server}/moved"), {}, 5)
        assert not ok
        assert why.startswith(f"GET http://{server}/moved: expected 200, got 302 "
                              '(a redirect to "/healthz", not followed)')

    def test_connection_refused(self, closed_port: int) -> None:
        """Nothing listening: the check fails with "connection refused"."""
        url = f"http://127.0.0.1:{closed_port}/healthz"
        assert run_check(HttpCheck(url), {}, 5) == (
            False, f"GET {url}: expected 200, got connection refused")

    def test_no_answer_within_the_checks_own_timeout(self, server: str) -> None:
        """A server that never answers fails the check at its own timeout_seconds (shorter than
        the time the judgment leaves), saying it timed out."""
        ok, why = run_check(HttpCheck(f"http://{server}/hang", timeout_seconds=0.3), {}, 60)
        assert not ok and why == (f"GET http://{server}/hang: expected 200, got no answer "
                                  "within 0.3s (timeout)")

    def test_a_dripping_answer_is_bounded_too(self, server: str) -> None:
        """A server that sends its headers a byte at a time (each read well within the
        timeout) still fails the check at its timeout, as a timeout."""
        ok, why = run_check(HttpCheck(f"http://{server}/drip", timeout_seconds=0.5), {}, 60)
        assert not ok and why == (f"GET http://{server}/drip: expected 200, got no answer "
                                  "within 0.5s (timeout)")

    def test_https_is_verified(self, tmp_path: Path) -> None:
        """An https server whose certificate no system CA signed fails the check with a TLS
        error: the certificate is verified, not taken on trust."""
        cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                        str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
                        "-addext", "subjectAltName=IP:127.0.0.1"],
                       check=True, capture_output=True, timeout=20)
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
        for where in _serve(httpd):
            ok, why = run_check(HttpCheck(f"https://{where}/healthz"), {}, 5)
            assert not ok and "a TLS error" in why and "certificate verify failed" in why

    def test_a_503_fails_the_judgment_with_what_came(self, server: str) -> None:
        """A candidate answering 503 on its health URL is judged failed at the deadline, the
        reason naming the URL, the 200 expected and the 503 that came."""
        j = Judgment(deadline_seconds=3.1, soak_seconds=0, max_attempts=2,
                     checks=(HttpCheck(f"http://{server}/down", timeout_seconds=2),))
        verdict = judge(j, attempt=1, clock=FakeClock(),
                        check=lambda spec, timeout: run_check(spec, {}, timeout))
        assert not verdict.ok and verdict.reason_class == "check_failed"
        assert verdict.reason == (f"checks still failing at the deadline: GET http://{server}"
                                  '/down: expected 200, got 503: "down for maintenance"')


class TestReasonAtTheDeadline:
    def test_a_check_cut_short_by_the_deadline_keeps_the_answer_before(self) -> None:
        """When the last GET before the deadline had only milliseconds and timed out, the
        verdict says what the server answered before (503), not "no answer within 0.01s"."""
        from agent_fsm.agent import judge as judging
        from agent_fsm.node.check_config import HttpCheck
        from agent_fsm.node.config import Judgment

        spec = HttpCheck("http://127.0.0.1:9/healthz", 200, 5.0)
        now = [0.0]

        class Clock:
            def monotonic(self) -> float:
                return now[0]

            def sleep(self, seconds: float) -> None:
                now[0] += seconds

        def check(_spec: object, left: float) -> tuple[bool, str]:
            if left < 0.5:  # the deadline near: the GET gets no answer in the time left
                now[0] += left
                return False, f"GET {spec.url}: expected 200, got no answer within {left:g}s (timeout)"
            now[0] += 0.3
            return False, f"GET {spec.url}: expected 200, got 503: down for maintenance"

        verdict = judging.judge(Judgment(deadline_seconds=3.1, soak_seconds=0, checks=(spec,)),
                                attempt=1, clock=Clock(), check=check)
        assert not verdict.ok
        assert verdict.reason.endswith("got 503: down for maintenance"), verdict.reason


@pytest.fixture
def raw_server() -> Iterator[Callable[[bytes], str]]:
    """`answer(raw)`: the URL of a server on 127.0.0.1 that reads a request and sends `raw` as
    its whole answer, then closes the connection (once per request, as often as asked)."""
    sockets: list[socket.socket] = []

    def answer(raw: bytes) -> str:
        listener = socket.create_server(("127.0.0.1", 0))
        sockets.append(listener)

        def serve() -> None:
            with contextlib.suppress(OSError):
                while True:
                    conn, _ = listener.accept()
                    with conn:
                        conn.settimeout(5)
                        conn.recv(65536)
                        conn.sendall(raw)
        threading.Thread(target=serve, daemon=True).start()
        return f"http://127.0.0.1:{listener.getsockname()[1]}/healthz"

    yield answer
    for s in sockets:
        s.close()


def _recorded(url: str) -> str:
    """The reason a node records for a candidate whose only check is a GET of `url`."""
    j = Judgment(deadline_seconds=0.5, soak_seconds=0, max_attempts=2,
                 checks=(HttpCheck(url, timeout_seconds=5),))
    verdict = judge(j, attempt=1, clock=FakeClock(),
                    check=lambda spec, timeout: run_check(spec, {}, timeout))
    assert not verdict.ok
    return reasons.one_line(verdict.reason)  # as `upgrade.results` records it


AT_DEADLINE = "checks still failing at the deadline: GET "
FORGED = "checks passed and it stayed up 30s"


class TestAnAnswerIsUntrustedText:
    """Whatever answers on the port writes only the quoted part of the reason: bounded, its
    control characters visible, and never a line of its own."""

    def test_a_folded_location_is_a_malformed_answer(self, raw_server: Callable[[bytes], str]
                                                     ) -> None:
        """A Location header folded over two lines (obsolete syntax) makes the answer malformed:
        the reason says so in agent-fsm's words, and the folded line's text is not in it."""
        url = raw_server(b"HTTP/1.1 302 Found\r\nLocation: /login\r\n " + FORGED.encode()
                         + b"\r\nContent-Length: 0\r\n\r\n")
        why = _recorded(url)
        assert why == (f"{AT_DEADLINE}{url}: expected 200, got a malformed answer (header "
                       '"Location" folded over lines, an obsolete syntax)')
        assert FORGED not in why

    def test_a_header_line_without_a_colon_is_a_malformed_answer(
            self, raw_server: Callable[[bytes], str]) -> None:
        """A header line that is not `name: value` makes the answer malformed (the lines after
        it are not taken for the body)."""
        url = raw_server(b"HTTP/1.1 503 Down\r\nnot a header\r\nContent-Length: 5\r\n\r\n"
                         + FORGED.encode())
        assert _recorded(url) == (f"{AT_DEADLINE}{url}: expected 200, got a malformed answer "
                                  "(a header line that is not `name: value`)")

    def test_control_characters_are_shown_visibly_in_quotes(
            self, raw_server: Callable[[bytes], str]) -> None:
        """Terminal escapes, backspace, a bidi override and a `"` in the Location and the body's
        first line come out written visibly, inside the quotes that mark the server's words."""
        url = raw_server(b"HTTP/1.1 302 Found\r\nLocation: /a\x1b]0;title\x07\x1b[2J\r\n"
                         b"Content-Length: 40\r\n\r\nx\x08\xe2\x80\xaeb\", not followed); "
                         b"ok\r\nsecond line")
        why = _recorded(url)
        assert why == (f'{AT_DEADLINE}{url}: expected 200, got 302 (a redirect to '
                       r'"/a\x1b]0;title\x07\x1b[2J", not followed): "x\x08\u202eb\", '
                       r'not followed); ok"')
        assert not any(c in why for c in "\x1b\x07\x08\r\n\u202e")

    def test_an_enormous_header_line_is_a_malformed_answer_at_once(
            self, raw_server: Callable[[bytes], str]) -> None:
        """A header line of 100 000 bytes fails the check as a malformed answer, not as a
        timeout after the check's whole timeout_seconds."""
        url = raw_server(b"HTTP/1.1 200 OK\r\nX-Junk: " + b"\x1b[2J" * 25_000 + b"\r\n\r\n")
        assert run_check(HttpCheck(url, timeout_seconds=5), {}, 5) == (
            False, f"GET {url}: expected 200, got a malformed answer (a line of its headers "
                   "was too long)")

    def test_an_enormous_body_is_quoted_within_its_bound(
            self, raw_server: Callable[[bytes], str]) -> None:
        """A megabyte of escape sequences as the body is quoted cut to 100 characters, and the
        recorded reason stays within MAX_REASON."""
        url = raw_server(b"HTTP/1.1 503 Down\r\n\r\n" + b"\x1b]0;title\x07" * 100_000)
        why = _recorded(url)
        quoted_body = why.split(": expected 200, got 503: ", 1)[1]
        assert quoted_body.startswith(r'"\x1b]0;title\x07') and quoted_body.endswith('…"')
        assert len(quoted_body) <= 102 and len(why) <= reasons.MAX_REASON
        assert "\x1b" not in why

    def test_a_status_line_that_is_not_http(self, raw_server: Callable[[bytes], str]) -> None:
        """An answer whose first line is not an HTTP status line is malformed, and that line is
        all the reason quotes of it, visibly."""
        url = raw_server(b"\x1b]0;title\x07SSH-2.0\r\nLocation: /x\r\n\r\n")
        assert _recorded(url) == (f"{AT_DEADLINE}{url}: expected 200, got a malformed answer "
                                  "(its first line is not an HTTP status line: "
                                  r'"\x1b]0;title\x07SSH-2.0")')
