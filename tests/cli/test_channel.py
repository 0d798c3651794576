"""`agent-fsm channel …` as a release engineer runs it, with real ssh-keygen keys and a real
release archive: the directory it writes is what a node believes, every change signed again
with a higher index version, and every refusal one line that changes nothing."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent_fsm.actions.channel import signatures
from agent_fsm.actions.releases import trust as release_trust
from agent_fsm.node.channel import documents as docs
from agent_fsm.node.channel import trust
from tests.helpers import one_line
from tests.node.test_release_store import make_release

pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None,
                                reason="needs OpenSSH's ssh-keygen (Debian: openssh-client)")
ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "AGENT_FSM_CONFIG"}
    return subprocess.run([sys.executable, "-m", "agent_fsm", "channel", *map(str, args)],
                          cwd=ROOT, env=env, text=True, capture_output=True, timeout=120,
                          check=False)


def ok(*args: str) -> dict[str, object]:
    done = cli(*args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f",
                    str(path)], check=True, timeout=30)
    return path


def archive_of(release: Path, where: Path) -> Path:
    out = where / f"{release.name}.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        tar.add(release, arcname=release.name)
    return out


def node_believes(channel: Path, root_file: Path) -> docs.Index:
    """What a node that trusts `root_file` believes of the channel: it chains through root/N.json
    to the newest root, then checks the index."""
    root = docs.parse_root(docs.read_envelope(root_file.read_bytes(), "root").body)
    while (channel / "root" / f"{root.version + 1}.json").exists():
        env = docs.read_envelope((channel / "root" / f"{root.version + 1}.json").read_bytes(), "r")
        root = trust.next_root(root, env, signatures.check)
    env = docs.read_envelope((channel / "index.json").read_bytes(), "the index")
    return trust.accept_index(root, env, channel="stable", seen=None,
                              now=datetime.now(UTC), check=signatures.check)


@pytest.fixture
def made(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A channel `stable` with root keys primary and backup, and CI's index key."""
    keys = {n: str(keygen(tmp_path / n)) for n in ("primary", "backup", "ci", "eve")}
    channel = tmp_path / "stable"
    ok("init", channel, "--channel", "stable", "--root-key", f"primary={keys['primary']}",
       "--root-key", f"backup={keys['backup']}", "--index-key", f"ci={keys['ci']}")
    return channel, keys


class TestPublish:
    def test_a_published_archive_is_what_a_node_believes(self, made: tuple[Path, dict[str, str]],
                                                         tmp_path: Path) -> None:
        """`publish --archive` copies the archive in and lists it with its size, sha256 and the
        release digest `release digest` prints; a node starting from root.json believes it."""
        channel, keys = made
        release = make_release(tmp_path / "build", "1.1.0")
        archive = archive_of(release, tmp_path)
        shown = ok("publish", channel, "--version", "1.1.0", "--archive", archive,
                   "--rollout", "10", "--key", f"ci={keys['ci']}")
        assert shown["changed"] == "1.1.0 published at 10 %; index version 2"
        index = node_believes(channel, channel / "root" / "1.json")
        entry = index.entry("1.1.0")
        assert index.version == 2 and entry is not None and entry.rollout == 10
        assert entry.digest == release_trust.digest(release)
        copied = channel / str(entry.archive)
        assert copied.read_bytes() == archive.read_bytes()
        assert entry.sha256 == "sha256:" + hashlib.sha256(copied.read_bytes()).hexdigest()
        assert entry.size == archive.stat().st_size

    def test_rollout_halt_and_revoke_each_sign_a_new_index(
            self, made: tuple[Path, dict[str, str]]) -> None:
        """Raising, halting and revoking each raise the index version, and `show` says so, with
        the revocation's reason shown with its control characters visible."""
        channel, keys = made
        key = f"ci={keys['ci']}"
        ok("publish", channel, "--version", "2.0.0", "--image", "docker://r/a:2", "--digest",
           "sha256:" + "1" * 64, "--key", key)
        assert ok("rollout", channel, "2.0.0", "50", "--key", key)["changed"] == \
            "2.0.0 rollout 0 % → 50 %; index version 3"
        assert ok("halt", channel, "2.0.0", "--key", key)["changed"] == \
            "2.0.0 halted (rollout 0 %, was 50 %); index version 4"
        ok("revoke", channel, "2.0.0", "--reason", "leaks\x1b[2J memory", "--key", key)
        entry = node_believes(channel, channel / "root.json").entry("2.0.0")
        assert entry is not None and entry.revoked == "leaks\x1b[2J memory"
        human = cli("show", channel)
        assert human.returncode == 0 and "revoked: leaks\\x1b[2J memory" in human.stdout
        assert "index version 5" in human.stdout and "\x1b" not in human.stdout


class TestRefused:
    @pytest.mark.parametrize(("args", "words"), [
        (("--key", "eve={eve}"), "the new index (signed by eve) has 0 good signatures"),
        (("--key", "ci"), "--key takes NAME=FILE"),
        (("--digest", "sha256:" + "2" * 64, "--key", "ci={ci}"), "holds release digest"),
    ])
    def test_a_refused_publish_changes_nothing(self, made: tuple[Path, dict[str, str]],
                                               tmp_path: Path, args: tuple[str, ...],
                                               words: str) -> None:
        """Signed by a key the root does not name for the index, a malformed key, or a digest
        that is not the archive's: one line, and the channel's files are as they were."""
        channel, keys = made
        before = {p: p.read_bytes() for p in channel.rglob("*") if p.is_file()}
        archive = archive_of(make_release(tmp_path / "b", "1.2.0"), tmp_path)
        done = cli("publish", channel, "--version", "1.2.0", "--archive", archive,
                   *(a.format(**keys) for a in args))
        assert done.returncode != 0 and words in one_line(done)
        assert {p: p.read_bytes() for p in channel.rglob("*") if p.is_file()} == before

    def test_an_archive_of_another_version_is_refused(self, made: tuple[Path, dict[str, str]],
                                                      tmp_path: Path) -> None:
        """An archive holding 1.3.0 published as 1.4.0: refused, naming both."""
        channel, keys = made
        archive = archive_of(make_release(tmp_path / "b", "1.3.0"), tmp_path)
        done = cli("publish", channel, "--version", "1.4.0", "--archive", archive,
                   "--key", f"ci={keys['ci']}")
        assert done.returncode == 1 and "holds release 1.3.0, not 1.4.0" in one_line(done)

    def test_a_changed_index_is_not_built_on(self, made: tuple[Path, dict[str, str]]) -> None:
        """index.json changed on disk after it was signed: the next command refuses it."""
        channel, keys = made
        path = channel / "index.json"
        path.write_bytes(path.read_bytes().replace(b'"version":1', b'"version":7'))
        done = cli("refresh", channel, "--key", f"ci={keys['ci']}")
        assert done.returncode == 1 and "index.json has 0 good signatures" in one_line(done)


class TestRotate:
    def test_keys_rotate_to_the_backup_and_nodes_follow(
            self, made: tuple[Path, dict[str, str]]) -> None:
        """The primary is lost: the backup signs root 2, naming itself for roots and the index;
        a node still trusting root 1 follows to root 2 and believes what the backup signs."""
        channel, keys = made
        shown = ok("rotate", channel, "--root-key", f"backup={keys['backup']}", "--index-key",
                   f"backup={keys['backup']}", "--sign", f"backup={keys['backup']}")
        assert shown["changed"] == ("root version 2: backup sign roots, backup the index; "
                                    "index version 2 signed by them")
        assert node_believes(channel, channel / "root" / "1.json").version == 2
        ok("refresh", channel, "--key", f"backup={keys['backup']}")
        assert node_believes(channel, channel / "root" / "1.json").version == 3
        done = cli("refresh", channel, "--key", f"ci={keys['ci']}")
        assert done.returncode == 1 and "0 good signatures" in one_line(done)

    def test_a_root_the_old_keys_did_not_sign_is_not_written(
            self, made: tuple[Path, dict[str, str]]) -> None:
        """A new root signed only by a key root 1 does not trust for roots: refused before any
        file is written."""
        channel, keys = made
        done = cli("rotate", channel, "--root-key", f"eve={keys['eve']}", "--index-key",
                   f"eve={keys['eve']}", "--sign", f"eve={keys['eve']}")
        assert done.returncode == 1 and "by the keys of version 1" in one_line(done)
        assert not (channel / "root" / "2.json").exists()


def test_help_teaches_the_commands() -> None:
    """`channel --help` names each command with an example."""
    done = cli("--help")
    assert done.returncode == 0
    for command in ("init", "publish", "rollout", "halt", "revoke", "refresh", "rotate", "show"):
        assert command in done.stdout
    assert "Example:" in done.stdout
