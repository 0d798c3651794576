"""Real servers a fleet follows its channel from: nginx over HTTPS with a CA made here, and an
OCI registry (Debian's `docker-registry`), each a plain process in a directory of the caller's.

Both listen on 127.0.0.1 only, on a port free when they start; the private systemds share the
host's network namespace, so their nodes reach them there. Each is stopped by its own pid.

    ca = TestCA.make(directory / "tls")
    with Nginx(directory / "nginx", served=channel_dir.parent, ca=ca) as web:
        web.url  # https://127.0.0.1:PORT
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

NGINX = "/usr/sbin/nginx"
REGISTRY = "/usr/bin/docker-registry"
PACKAGES = {"nginx": "nginx-light", "docker-registry": "docker-registry", "skopeo": "skopeo",
            "openssl": "openssl"}


def missing() -> list[str]:
    """What these servers need and this machine lacks, by Debian package."""
    paths = {"nginx": NGINX, "docker-registry": REGISTRY}
    return [f"{package} (`make system-packages`)" for tool, package in PACKAGES.items()
            if not (Path(paths[tool]).exists() if tool in paths else shutil.which(tool))]


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


@dataclass(frozen=True)
class TestCA:
    """A CA made for one run and a certificate it signed for 127.0.0.1, with the extensions
    Python 3.13's strict checks ask for (key usage, key identifiers): a Debian 13 node refuses
    a CA without them."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def make(cls, directory: Path) -> TestCA:
        directory.mkdir(parents=True, exist_ok=True)
        _openssl("req", "-x509", "-newkey", "ed25519", "-nodes", "-keyout", "ca.key", "-out",
                 "ca.crt", "-days", "2", "-subj", "/CN=agent-fsm test CA", "-addext",
                 "basicConstraints=critical,CA:TRUE", "-addext",
                 "keyUsage=critical,keyCertSign,cRLSign", cwd=directory)
        _openssl("req", "-newkey", "ed25519", "-nodes", "-keyout", "srv.key", "-out", "srv.csr",
                 "-subj", "/CN=127.0.0.1", cwd=directory)
        (directory / "ext.cnf").write_text(
            "subjectAltName=IP:127.0.0.1\nkeyUsage=critical,digitalSignature\n"
            "extendedKeyUsage=serverAuth\nauthorityKeyIdentifier=keyid\n"
            "subjectKeyIdentifier=hash\n")
        _openssl("x509", "-req", "-in", "srv.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", "srv.crt", "-days", "2", "-extfile", "ext.cnf",
                 cwd=directory)
        return cls(directory / "ca.crt", directory / "srv.crt", directory / "srv.key")


class _Server:
    """A foreground server process of the caller's, listening on `port` once started."""

    def __init__(self, directory: Path, port: int) -> None:
        self.dir, self.port = directory, port
        self.proc: subprocess.Popen[bytes] | None = None
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log = self.dir / "server.log"

    def argv(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout: float = 20) -> None:
        """Start it and wait until its port answers; raises with its log if it does not."""
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                break
            with contextlib.suppress(OSError), socket.create_connection(
                    ("127.0.0.1", self.port), timeout=1):
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.argv()[0]} did not listen on 127.0.0.1:{self.port}: "
                           f"{self.log.read_text(errors='replace')[-2000:]}")

    def stop(self) -> None:
        """Stop it by its own pid (and its workers, its process group) and wait for it."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def __enter__(self) -> _Server:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class Nginx(_Server):
    """nginx over HTTPS serving `served` at https://127.0.0.1:PORT/, and the same tree at
    /drip/ one byte a second (a slow server)."""

    def __init__(self, directory: Path, *, served: Path, ca: TestCA,
                 port: int | None = None) -> None:
        super().__init__(directory, port or free_port())
        self.url = f"https://127.0.0.1:{self.port}"
        self.config = self.dir / "nginx.conf"
        temp = {t: self.dir / "temp" / t for t in ("client", "proxy", "fastcgi", "uwsgi", "scgi")}
        for path in temp.values():
            path.mkdir(parents=True, exist_ok=True)
        temps = "".join(f"    {t}_temp_path {p};\n" for t, p in
                        (("client_body", temp["client"]), *((t, temp[t]) for t in
                                                            ("proxy", "fastcgi", "uwsgi", "scgi"))))
        self.config.write_text(
            "daemon off;\nmaster_process on;\nworker_processes 1;\nuser root;\n"
            f"pid {self.dir / 'nginx.pid'};\nerror_log {self.dir / 'error.log'} info;\n"
            "events { worker_connections 64; }\n"
            "http {\n"
            f"    access_log {self.dir / 'access.log'};\n{temps}"
            "    default_type application/octet-stream;\n"
            "    server {\n"
            f"        listen 127.0.0.1:{self.port} ssl;\n"
            f"        ssl_certificate {ca.cert};\n        ssl_certificate_key {ca.key};\n"
            f"        root {served};\n"
            f"        location /drip/ {{ alias {served}/; limit_rate 1; }}\n"
            "    }\n}\n")

    def argv(self) -> list[str]:
        return [NGINX, "-c", str(self.config), "-p", str(self.dir), "-e",
                str(self.dir / "error.log")]

    def asked(self) -> list[str]:
        """The paths asked of it so far (its access log), oldest first."""
        log = self.dir / "access.log"
        if not log.exists():
            return []
        return [line.split('"')[1].split()[1] for line in log.read_text().splitlines()
                if line.count('"') >= 2 and len(line.split('"')[1].split()) >= 2]


class Registry(_Server):
    """Debian's docker-registry (distribution) at 127.0.0.1:PORT over plain HTTP."""

    def __init__(self, directory: Path, port: int | None = None) -> None:
        super().__init__(directory, port or free_port())
        self.address = f"127.0.0.1:{self.port}"
        self.config = self.dir / "config.yml"
        (self.dir / "storage").mkdir(exist_ok=True)
        self.config.write_text(
            "version: 0.1\nlog: { level: warn }\n"
            f"storage: {{ filesystem: {{ rootdirectory: {self.dir / 'storage'} }} }}\n"
            f"http: {{ addr: {self.address} }}\n")

    def argv(self) -> list[str]:
        return [REGISTRY, "serve", str(self.config)]
