"""Your agent's files in a release: `release pack --payload SRC` puts SRC's tree in payload/,
normalized, in the digest and in the signature made at pack; `release sign` signs a packed
release (again) and `release digest` prints what is signed, from the directory alone (real
files, real ssh-keygen keys and signatures)."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agent_fsm.actions.releases import trust
from agent_fsm.actions.releases.packing import add, copy_payload, pack
from agent_fsm.errors import Refused, ReleaseError
from agent_fsm.node.releases import signing
from agent_fsm.system import sshsig
from tests.actions.test_signing import ALLOWED, keygen, trusting
from tests.helpers import DEFAULT_CONFIG, World, make_world, one_line
from tests.node.test_release_store import make_release

pytestmark = pytest.mark.xdist_group("packed-payload")  # its module fixture is made once (Makefile)

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = ROOT / "docs" / "operations.md"
needs_ssh_keygen = pytest.mark.skipif(shutil.which("ssh-keygen") is None,
                                      reason="needs OpenSSH's ssh-keygen (Debian: openssh-client)")


def agent_source(where: Path) -> Path:
    """A user's agent as a build leaves it: an executable, data with loose modes, an empty
    directory."""
    src = where / "build"
    (src / "bin").mkdir(parents=True)
    (src / "data").mkdir()
    (src / "var").mkdir()
    (src / "bin" / "myagent").write_text("#!/bin/sh\nexec sleep infinity\n")
    (src / "bin" / "myagent").chmod(0o750)
    (src / "data" / "a b.txt").write_text("served\n")
    (src / "data" / "a b.txt").chmod(0o666)
    (src / "data" / "secret").write_text("key\n")
    (src / "data" / "secret").chmod(0o600)
    return src


def with_payload(where: Path, version: str = "1.0.0") -> Path:
    """A small release (as `make_release`) whose payload/ is copied as `release pack` copies it."""
    release = make_release(where, version)
    copy_payload(agent_source(where), release / "payload")
    return release


def cli(*args: str, root: Path | None = None,
        config: Path | None = None) -> subprocess.CompletedProcess[str]:
    """agent-fsm as an operator runs it (no config unless given)."""
    env = {k: v for k, v in os.environ.items() if k != "AGENT_FSM_CONFIG"}
    head = [*(["--config", str(config)] if config else []), *(["--root", str(root)] if root else [])]
    return subprocess.run([sys.executable, "-m", "agent_fsm", *head, *args], cwd=ROOT, env=env,
                          text=True, capture_output=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One release packed with a payload, for the tests that only read it."""
    where = tmp_path_factory.mktemp("packed")
    return pack("2.0.0", where / "myagent-2.0.0", ("sleep", "infinity"),
                payload=agent_source(where))


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "keys").mkdir()
    return {name: keygen(tmp_path / "keys", name) for name in ("ops", "eve")}


@pytest.fixture
def node(tmp_path: Path, keys: dict[str, Path]) -> World:
    """A node whose config names allowed_signers, which lists the `ops` key only."""
    root = tmp_path / "root"
    trusting(root, keys["ops"])
    return make_world(root, DEFAULT_CONFIG._replace(allowed_signers=ALLOWED))


class TestPack:
    def test_payload_tree_is_copied_with_the_stores_modes(self, packed: Path) -> None:
        """SRC's files are in payload/ with their bytes; executables stay executable (0755),
        other files and the empty directory get 0644 and 0755, never group or world writable."""
        payload = packed / "payload"
        modes = {str(p.relative_to(payload)): stat.S_IMODE(p.lstat().st_mode)
                 for p in payload.rglob("*")}
        assert modes == {"bin": 0o755, "bin/myagent": 0o755, "data": 0o755,
                         "data/a b.txt": 0o644, "data/secret": 0o644, "var": 0o755}
        assert stat.S_IMODE(payload.stat().st_mode) == 0o755
        assert (payload / "data" / "a b.txt").read_text() == "served\n"
        assert os.access(payload / "bin" / "myagent", os.X_OK)

    def test_payload_is_in_the_digest(self, packed: Path, tmp_path: Path) -> None:
        """The release's digest changes when one byte of a payload file changes, or a payload
        file is added: the payload is covered like the rest."""
        copy = tmp_path / "copy"
        shutil.copytree(packed, copy)
        before = trust.digest(copy)
        assert before == trust.digest(packed)
        target = copy / "payload" / "data" / "a b.txt"
        target.write_text("served!\n")
        changed = trust.digest(copy)
        (copy / "payload" / "var" / "new").write_text("")
        assert len({before, changed, trust.digest(copy)}) == 3

    @pytest.mark.parametrize("fault", ["missing", "a file", "a symlink", "a FIFO",
                                       "a setuid file", "a setgid file", "holds the output"])
    def test_a_bad_payload_is_refused_in_one_line(self, tmp_path: Path, fault: str) -> None:
        """A SRC that is missing, not a directory, holds a link, a FIFO, a setuid or setgid
        file, or holds the output is refused in one line naming the path; nothing is packed."""
        src = agent_source(tmp_path)
        output = tmp_path / "out"
        named = src
        if fault == "missing":
            named = src = tmp_path / "nope"
        elif fault == "a file":
            named = src = src / "bin" / "myagent"
        elif fault == "a symlink":
            named = src / "data" / "etc"
            named.symlink_to("/etc")
        elif fault == "a FIFO":
            named = src / "var" / "fifo"
            os.mkfifo(named)
        elif fault in ("a setuid file", "a setgid file"):
            named = src / "bin" / "myagent"
            named.chmod(0o4755 if fault == "a setuid file" else 0o2755)
        else:
            output = src / "out"
        with pytest.raises(ReleaseError) as refused:
            pack("2.0.0", output, payload=src)
        message = str(refused.value)
        assert "\n" not in message and str(named) in message, message
        assert "nothing was packed" in message
        assert not output.exists() and not list(output.parent.glob(".out.packing*"))

    def test_pack_prints_the_signed_digest(self, tmp_path: Path) -> None:
        """`release pack --payload` says what it packed, naming its release digest: the one
        `release digest` prints; the payload is there."""
        out = tmp_path / "myagent-2.0.0"
        packed = cli("release", "pack", "--version", "2.0.0", "--output", str(out),
                     "--payload", str(agent_source(tmp_path)))
        assert packed.returncode == 0, packed.stderr
        digest = cli("release", "digest", str(out))
        assert digest.returncode == 0, digest.stderr
        assert re.fullmatch(r"sha256:[0-9a-f]{64}\n", digest.stdout)
        assert f"packed release 2.0.0 in {out} (release digest {digest.stdout.strip()})" \
            in packed.stdout
        assert (out / "payload" / "bin" / "myagent").is_file()


class TestStored:
    def test_a_payload_file_changed_after_add_is_damaged_and_refused(
            self, world: World, tmp_path: Path) -> None:
        """The stored payload is checked with the rest: a byte changed after `add` makes the
        release DAMAGED, naming the file, and install refuses it."""
        added = add(with_payload(tmp_path), world.node)
        stored = added.path / "payload" / "bin" / "myagent"
        assert stat.S_IMODE(stored.stat().st_mode) == 0o755
        assert world.node.releases.integrity("1.0.0").problem is None
        stored.write_text("#!/bin/sh\nexit 0\n")
        problem = world.node.releases.integrity("1.0.0").problem
        assert problem is not None and "payload/bin/myagent changed content" in problem
        with pytest.raises(ReleaseError, match="not what was stored"):
            world.node.controller.fire("install", release="1.0.0")
        assert world.node.releases.selected() is None


@needs_ssh_keygen
class TestSignatures:
    def test_a_signature_made_at_pack_covers_the_payload(self, packed: Path, tmp_path: Path,
                                                         keys: dict[str, Path]) -> None:
        """A release packed with --payload and --sign-key verifies, as a user checks it with
        ssh-keygen over `release digest`; once a payload file changed, it no longer does."""
        out = pack("2.0.0", tmp_path / "signed", payload=agent_source(tmp_path),
                   sign_key=keys["ops"])
        allowed = trusting(tmp_path / "host", keys["ops"])
        assert sshsig.verify(Path(allowed), signing.NAMESPACE, out / signing.SIGNATURE,
                             trust.digest(out).encode()) == "ops@example.com"
        (out / "payload" / "data" / "a b.txt").write_text("changed\n")
        with pytest.raises(Exception, match="incorrect signature"):
            sshsig.verify(Path(allowed), signing.NAMESPACE, out / signing.SIGNATURE,
                          trust.digest(out).encode())

    def test_a_payload_changed_after_signing_is_refused_at_add(
            self, node: World, tmp_path: Path, keys: dict[str, Path]) -> None:
        """Under allowed_signers, a release whose payload file changed after it was signed is
        refused (exit 3), nothing stored; the unchanged one is stored."""
        release = with_payload(tmp_path)
        trust.sign(release, keys["ops"])
        (release / "payload" / "data" / "secret").write_text("other\n")
        with pytest.raises(Refused, match="incorrect signature"):
            add(release, node.node)
        assert node.node.releases.versions() == []
        (release / "payload" / "data" / "secret").write_text("key\n")
        assert add(release, node.node).version == "1.0.0"

    def test_release_sign_then_add_under_allowed_signers(
            self, node: World, tmp_path: Path, keys: dict[str, Path]) -> None:
        """`release sign DIR --sign-key KEY` signs a release packed unsigned, replacing a
        release.sig another key made; the node that lists KEY then stores it."""
        release = with_payload(tmp_path)
        first = cli("release", "sign", str(release), "--sign-key", str(keys["eve"]))
        assert first.returncode == 0, first.stderr
        with pytest.raises(Refused, match="does not verify"):
            add(release, node.node)
        again = cli("release", "sign", str(release), "--sign-key", str(keys["ops"]))
        assert again.returncode == 0, again.stderr
        assert f"signs {trust.digest(release)}" in again.stdout
        assert add(release, node.node).version == "1.0.0"
        stored = node.paths.releases_dir / "1.0.0"
        assert trust.check(stored, "1.0.0", node.node.config, node.paths) == "ops@example.com"

    def test_release_digest_is_what_the_signature_covers(
            self, world: World, tmp_path: Path, keys: dict[str, Path]) -> None:
        """What `release digest` prints is what release.sig signs: `ssh-keygen -Y verify` of it
        succeeds as the docs show; signing does not change it; for an unsigned release it is
        the digest `release add` stores."""
        release = with_payload(tmp_path)
        unsigned = cli("release", "digest", str(release)).stdout.strip()
        assert add(release, world.node).digest == unsigned
        assert cli("release", "sign", str(release), "--sign-key", str(keys["ops"])).returncode == 0
        assert cli("release", "digest", str(release)).stdout.strip() == unsigned
        allowed = trusting(tmp_path / "host", keys["ops"])
        agent_fsm = f"{sys.executable} -m agent_fsm"
        by_hand = subprocess.run(
            ["sh", "-c", f'printf %s "$({agent_fsm} release digest "$1")" | ssh-keygen -Y verify '
             f'-f {allowed} -I ops@example.com -n agent-fsm-release -s "$1/release.sig"',
             "sh", str(release)],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
        assert by_hand.returncode == 0 and "Good" in by_hand.stdout + by_hand.stderr, by_hand

    def test_a_digest_signed_by_hand_is_accepted(self, node: World, tmp_path: Path,
                                                 keys: dict[str, Path]) -> None:
        """Signing the printed digest with ssh-keygen alone, as the docs show for another
        machine, makes a release.sig the node accepts."""
        release = with_payload(tmp_path)
        subprocess.run(["sh", "-c", f'printf %s "$1" | ssh-keygen -q -Y sign -f {keys["ops"]} '
                        '-n agent-fsm-release > "$2/release.sig"', "sh", trust.digest(release),
                        str(release)], check=True, timeout=60)
        assert add(release, node.node).version == "1.0.0"


class TestByHand:
    def test_the_docs_pipeline_computes_the_signed_digest(self, tmp_path: Path) -> None:
        """The coreutils pipeline in docs/operations.md prints what `release digest` prints,
        for names with spaces, a leading dash, non-ASCII letters and group-only x bits, and
        leaves release.sig out."""
        release = with_payload(tmp_path)
        for name in ("-dash", "é", "Z", "a b", "a-b"):
            (release / "payload" / "data" / name).write_text(name)
        (release / "payload" / "data" / "a b").chmod(0o710)
        (release / signing.SIGNATURE).write_text("not a signature\n")
        text = OPERATIONS.read_text()
        snippet = text.split("<!-- signed-digest-by-hand -->\n```sh\n", 1)[1].split("```", 1)[0]
        proc = subprocess.run(["sh", "-c", snippet.replace("cd DIR", 'cd "$1"'), "sh",
                               str(release)], capture_output=True, text=True, timeout=60,
                              check=True, env={**os.environ, "LC_ALL": "C.UTF-8"})
        assert proc.stdout.strip() == trust.digest(release), proc.stderr


class TestRefusals:
    @pytest.mark.parametrize("what", ["missing", "not a release", "stored"])
    def test_sign_refuses_what_is_not_a_packed_release(self, world: World, tmp_path: Path,
                                                       what: str) -> None:
        """`release sign` of a missing directory, one without release.toml, or a stored
        release (signing it would damage it) exits 1 with one line saying so; nothing changes."""
        target = tmp_path / "nope"
        if what == "not a release":
            target = agent_source(tmp_path)
        elif what == "stored":
            target = add(with_payload(tmp_path), world.node).path
        proc = cli("release", "sign", str(target), "--sign-key", str(tmp_path / "key"))
        line = one_line(proc)
        assert proc.returncode == 1 and str(target) in line
        assert {"missing": "does not exist", "not a release": "release.toml is missing",
                "stored": "is a stored release"}[what] in line
        assert not (target / signing.SIGNATURE).exists()
        if what == "stored":
            assert world.node.releases.integrity("1.0.0").problem is None

    def test_digest_of_a_tree_the_store_refuses_names_the_path(self, tmp_path: Path) -> None:
        """`release digest` of a release holding a symlink exits 1 naming it."""
        release = with_payload(tmp_path)
        (release / "payload" / "link").symlink_to("/etc/passwd")
        proc = cli("release", "digest", str(release))
        assert proc.returncode == 1 and "payload/link is a symlink" in one_line(proc)
