"""The SHA-256 agent-fsm hashes with: the same digests as OpenSSL's, without loading OpenSSL."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from agent_fsm.node import sha256

ROOT = Path(__file__).resolve().parents[2]


def _in_a_fresh_process(code: str) -> str:
    return subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
                           + code], capture_output=True, text=True, check=True, cwd=ROOT).stdout


class TestSha256:
    def test_digests_are_openssls(self) -> None:
        """Digests recorded by one implementation check against the other: a state file written
        by a writer (OpenSSL loaded, through filelock) verifies in `status` (CPython's own), and
        back."""
        for data in (b"", b"abc", bytes(range(256)) * 4099):
            assert sha256.hexdigest(data) == hashlib.sha256(data).hexdigest()
        h = sha256.sha256()
        for part in (b"agent", b"-", b"fsm"):
            h.update(part)
        assert h.hexdigest() == hashlib.sha256(b"agent-fsm").hexdigest()

    def test_checking_a_release_does_not_load_openssl(self, tmp_path: Path) -> None:
        """A process that hashes a release tree never maps OpenSSL's libcrypto for it (what a
        reader such as `status --json` would otherwise pay at each run)."""
        release = tmp_path / "rel"
        (release / "bin").mkdir(parents=True, mode=0o755)
        release.chmod(0o755)
        (release / "bin" / "agent-fsm").write_bytes(b"#!/bin/sh\n" * 10_000)
        (release / "bin" / "agent-fsm").chmod(0o755)
        out = _in_a_fresh_process(
            "from pathlib import Path\n"
            "from agent_fsm.node.releases import store as release_store, tree as release_tree\n"
            f"entries = release_tree.scan(Path({str(release)!r}))\n"
            "print(release_store.digest(release_store.manifest(entries)))\n"
            "print(sorted(m for m in ('_hashlib', 'hashlib', 'hmac') if m in sys.modules))\n")
        digest, loaded = out.splitlines()
        assert loaded == "[]"
        manifest = (b"agent-fsm release manifest v1\nd 0755 - - bin\nf 0755 100000 "
                    + hashlib.sha256(b"#!/bin/sh\n" * 10_000).hexdigest().encode()
                    + b" bin/agent-fsm\n")
        assert digest == "sha256:" + hashlib.sha256(manifest).hexdigest()

    def test_openssl_is_used_once_loaded_anyway(self) -> None:
        """Where something has loaded OpenSSL already (the full CLI's libraries), its faster
        SHA-256 is used."""
        out = _in_a_fresh_process("import hashlib\nfrom agent_fsm.node import sha256\n"
                                  "print(type(sha256.sha256()) is type(hashlib.sha256()))\n")
        assert out == "True\n"

    def test_openssl_is_used_when_asked_after_the_lock(self, tmp_path: Path) -> None:
        """A process that took the writers' lock (filelock imported without OpenSSL), then asks
        for OpenSSL's SHA-256 (`release add`), hashes with OpenSSL's, and the lock mapped none."""
        out = _in_a_fresh_process(
            "from pathlib import Path\n"
            "from agent_fsm.node import sha256\n"
            "from agent_fsm.node.state import lock\n"
            f"with lock.held(Path({str(tmp_path / 'lock')!r}), 5.0):\n"
            "    print('_hashlib' in sys.modules)\n"
            "sha256.prefer_openssl()\n"
            "import _hashlib\n"
            "print(type(sha256.sha256()) is _hashlib.HASH)\n")
        assert out == "False\nTrue\n"

    def test_a_release_read_whole_is_hashed_by_openssl_and_a_start_check_is_not(
            self, tmp_path: Path) -> None:
        """`upgrade`, `install` and `activate` read every byte of the release they will run
        (`reread`) with OpenSSL's SHA-256, 2-3 times faster on a packed release; the stat-only
        check of a daemon's start (`verify`) maps no OpenSSL."""
        from tests.helpers import make_world

        world = make_world(tmp_path / "root")
        (world.add_release("2.0.0") / "payload.bin").write_bytes(b"x" * 100_000)
        world.record_digest("2.0.0")
        out = _in_a_fresh_process(
            "from pathlib import Path\n"
            "from agent_fsm.node.config import Config, Judgment\n"
            "from agent_fsm.node.paths import Paths\n"
            "from agent_fsm.node.releases.pointers import Releases\n"
            "config = Config(name='agent', judgment=Judgment(deadline_seconds=60, soak_seconds=5,"
            " max_attempts=3))\n"
            f"releases = Releases(Paths(config, Path({str(tmp_path / 'root')!r})))\n"
            "releases.verify('2.0.0')\n"
            "print('_hashlib' in sys.modules)\n"
            "releases.reread('2.0.0')\n"
            "print('_hashlib' in sys.modules)\n")
        assert out == "False\nTrue\n"
