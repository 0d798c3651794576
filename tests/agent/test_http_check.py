"""HTTP(S) checks against a real server on 127.0.0.1 in this process: what passes, and what a
failing one says in the judgment's reason (what was expected, what came)."""

from __future__ import annotations

import http.server
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_fsm.agent.judge import judge, run_check
from agent_fsm.node.check_config import HttpCheck
from agent_fsm.node.config import Judgment
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
        assert why == f"GET http://{server}/down: expected 200, got 503: down for maintenance"

    def test_the_status_asked_for_is_the_one_that_passes(self, server: str) -> None:
        """A check may expect another status: 503 expected, 503 passes and 200 fails."""
        assert run_check(HttpCheck(f"http://{server}/down", status=503), {}, 5)[0]
        assert not run_check(HttpCheck(f"http://{server}/healthz", status=503), {}, 5)[0]

    def test_a_redirect_is_not_followed(self, server: str) -> None:
        """A 302 to a healthy page fails (it is not followed), and the reason says so."""
        ok, why = run_check(HttpCheck(f"http://{server}/moved"), {}, 5)
        assert not ok
        assert why.startswith(f"GET http://{server}/moved: expected 200, got 302 "
                              "(a redirect to /healthz, not followed)")

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
                                  "/down: expected 200, got 503: down for maintenance")


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
