"""HTTPS fetches of a channel's files against a real TLS server on loopback (a CA made by the
test with openssl): verified, bounded in bytes and time, resumed, and refused in one line."""

from __future__ import annotations

import http.server
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from agent_fsm.errors import ChannelError
from agent_fsm.system import fetch

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
BODY = bytes(range(256)) * 4096  # 1 MiB


def make_ca(where: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 that it signed."""
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=where, check=True, capture_output=True, timeout=60)

    run("req", "-x509", "-newkey", "ed25519", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
        "-days", "2", "-subj", "/CN=test-ca")
    run("req", "-newkey", "ed25519", "-nodes", "-keyout", "srv.key", "-out", "srv.csr", "-subj",
        "/CN=127.0.0.1")
    (where / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", "srv.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "srv.crt", "-days", "2", "-extfile", "ext.cnf")
    return where / "ca.crt", where / "srv.crt", where / "srv.key"


class Handler(http.server.BaseHTTPRequestHandler):
    """/body (Range honoured), /drip (a byte every 0.2 s), /drip-head (its status line and
    headers so), /missing (404), /moved (302)."""

    served: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.served.append(f"{self.path} {self.headers.get('Range', '')}")
        if self.path == "/body":
            start = 0
            if (rng := self.headers.get("Range")) is not None:
                start = int(rng.removeprefix("bytes=").rstrip("-"))
            self.send_response(206 if start else 200)
            self.send_header("Content-Length", str(len(BODY) - start))
            self.end_headers()
            self.wfile.write(BODY[start:])
        elif self.path == "/drip":
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            for _ in range(100):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.2)
        elif self.path == "/drip-head":
            for byte in b"HTTP/1.1 200 OK\r\nX-Padding: " + b"x" * 100 + b"\r\n":
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.2)
        else:
            self.send_response(404 if self.path == "/missing" else 302)
            self.send_header("Content-Length", "0")
            self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    where = tmp_path_factory.mktemp("tls")
    ca, cert, key = make_ca(where)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{httpd.server_address[1]}", ca
    httpd.shutdown()
    httpd.server_close()


class TestGet:
    def test_a_file_is_fetched_over_verified_tls(self, server: tuple[str, Path]) -> None:
        """With the test's CA, the body arrives whole; a missing file is None."""
        url, ca = server
        assert fetch.get(f"{url}/body", ca=ca, limit=len(BODY), seconds=10) == BODY
        assert fetch.get(f"{url}/missing", ca=ca, limit=10, seconds=10) is None

    def test_a_server_the_ca_did_not_sign_is_refused(self, server: tuple[str, Path]) -> None:
        """Without the test's CA (the system's only), the certificate is not trusted."""
        url, _ = server
        with pytest.raises(ChannelError, match="TLS certificate is not trusted"):
            fetch.get(f"{url}/body", ca=None, limit=len(BODY), seconds=10)

    @pytest.mark.parametrize(("path", "limit", "words"), [
        ("/body", 1000, "is larger than 1000 bytes"),
        ("/moved", 10, "answered 302"),
    ])
    def test_what_is_no_plain_answer_is_refused(self, server: tuple[str, Path], path: str,
                                                limit: int, words: str) -> None:
        """An answer over the bound, or a redirect, is refused in one line."""
        url, ca = server
        with pytest.raises(ChannelError, match=words) as caught:
            fetch.get(f"{url}{path}", ca=ca, limit=limit, seconds=10)
        assert "\n" not in str(caught.value)

    @pytest.mark.parametrize("path", ["/drip", "/drip-head"])
    def test_a_slow_drip_is_cut_off_at_the_deadline(self, server: tuple[str, Path],
                                                    path: str) -> None:
        """A server sending its body, or its status line and headers, a byte every 0.2 s (20 s
        in all) is cut off at the 1 s bound of the whole fetch, not kept while each byte comes
        in time."""
        url, ca = server
        t0 = time.monotonic()
        with pytest.raises(ChannelError, match="did not answer in time"):
            fetch.get(f"{url}{path}", ca=ca, limit=1000, seconds=1.0)
        assert time.monotonic() - t0 < 10  # far below the drip's 20 s (a hang fails, not a pace)


def _slow_then_dripping(upstream: int) -> tuple[int, threading.Event]:
    """A port whose listen queue is full for 2 s (a client's TCP connect waits that long), whose
    connection then relays the TLS server on `upstream`, its bytes dripped one every 0.1 s; the
    event ends it."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=0)
    port = int(listener.getsockname()[1])
    filler = socket.create_connection(("127.0.0.1", port))  # fills the queue of one
    stop = threading.Event()

    def serve() -> None:
        with listener, filler:
            if stop.wait(2.0):
                return
            listener.accept()[0].close()  # the filler's: the client's next SYN gets in
            listener.settimeout(10)
            conn, _ = listener.accept()
            with conn, socket.create_connection(("127.0.0.1", upstream)) as up:
                threading.Thread(target=lambda: [up.sendall(b) for b in iter(
                    lambda: conn.recv(4096), b"")], daemon=True).start()
                for byte in iter(lambda: up.recv(1), b""):
                    if stop.wait(0.1):
                        return
                    conn.sendall(byte)

    threading.Thread(target=serve, daemon=True).start()
    return port, stop


def test_a_slow_connect_and_a_dripped_handshake_are_cut_off_at_the_deadline(
        server: tuple[str, Path]) -> None:
    """A server whose TCP connect takes 2 s and which then drips its TLS handshake is cut off at
    the 3.5 s bound of the whole fetch, not given the bound afresh for the handshake (5.5 s)."""
    url, ca = server
    port, stop = _slow_then_dripping(int(url.rsplit(":", 1)[1]))
    try:
        t0 = time.monotonic()
        with pytest.raises(ChannelError, match="did not answer in time"):
            fetch.get(f"https://127.0.0.1:{port}/body", ca=ca, limit=len(BODY), seconds=3.5)
        assert time.monotonic() - t0 < 4.5  # midway: the bound afresh ends 5.5 s in
    finally:
        stop.set()


class TestDownload:
    def test_a_download_resumes_where_it_stopped(self, server: tuple[str, Path],
                                                 tmp_path: Path) -> None:
        """A file holding the first 1000 bytes is completed from byte 1000, with Range."""
        url, ca = server
        target = tmp_path / "part"
        target.write_bytes(BODY[:1000])
        Handler.served.clear()
        fetch.download(f"{url}/body", target, ca=ca, size=len(BODY), seconds=10)
        assert target.read_bytes() == BODY
        assert Handler.served == ["/body bytes=1000-"]

    def test_a_download_longer_than_its_size_is_refused(self, server: tuple[str, Path],
                                                        tmp_path: Path) -> None:
        """The index says 1000 bytes; the server sends more: refused."""
        url, ca = server
        with pytest.raises(ChannelError, match="larger than 1000 bytes"):
            fetch.download(f"{url}/body", tmp_path / "part", ca=ca, size=1000, seconds=10)
