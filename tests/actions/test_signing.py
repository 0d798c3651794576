"""Trusted signers: with `allowed_signers` in the config, `release add` stores only releases a
listed SSH key signed (real ssh-keygen keys, real signatures), and doctor checks them again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent_fsm.actions.releases import trust
from agent_fsm.actions.releases.packing import add
from agent_fsm.errors import ConfigError, Refused
from agent_fsm.node.config import parse
from agent_fsm.node.releases import signing
from agent_fsm.system import sshsig
from agent_fsm.views.doctor.signatures import signatures
from tests.helpers import DEFAULT_CONFIG, World, make_world
from tests.node.test_release_store import CONFIG, make_release

pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None,
                                reason="needs OpenSSH's ssh-keygen (Debian: openssh-client)")
ROOT = Path(__file__).resolve().parents[2]
ALLOWED = Path("/etc/agent-fsm/allowed_signers")  # as the config names it; below the root


def keygen(where: Path, name: str) -> Path:
    """A fresh ed25519 key without a passphrase; returns the private key's path."""
    key = where / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(key)],
                   check=True, timeout=30)
    return key


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "keys").mkdir()
    return {name: keygen(tmp_path / "keys", name) for name in ("ops", "eve")}


def trusting(root: Path, *keys: Path) -> str:
    """Write the node's allowed-signers file listing `keys` for agent-fsm's namespace."""
    path = root / ALLOWED.relative_to("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# trusted release signers\n" + "".join(
        f'{k.name}@example.com namespaces="{signing.NAMESPACE}" {k.with_suffix(".pub").read_text()}'
        for k in keys))
    return str(path)


@pytest.fixture
def node(tmp_path: Path, keys: dict[str, Path]) -> World:
    """A node whose config names allowed_signers, which lists the `ops` key only."""
    root = tmp_path / "root"
    trusting(root, keys["ops"])
    return make_world(root, DEFAULT_CONFIG._replace(allowed_signers=ALLOWED))


def signed(tmp_path: Path, key: Path, marker: str = "") -> Path:
    release = make_release(tmp_path, marker=marker)
    trust.sign(release, key)
    return release


class TestAdd:
    def test_signed_by_a_trusted_key_is_stored(self, node: World, tmp_path: Path,
                                               keys: dict[str, Path]) -> None:
        """A release a listed key signed is stored, its release.sig with it, and verifies there."""
        added = add(signed(tmp_path, keys["ops"]), node.node)
        assert not added.already and node.node.releases.versions() == ["1.0.0"]
        stored = node.paths.releases_dir / "1.0.0"
        assert (stored / signing.SIGNATURE).is_file()
        assert trust.check(stored, "1.0.0", node.node.config, node.paths) == "ops@example.com"

    def test_unsigned_is_refused(self, node: World, tmp_path: Path) -> None:
        """An unsigned release is refused (exit 3) in one line naming the release, the signer
        file and what to do; nothing is stored."""
        release = make_release(tmp_path)
        with pytest.raises(Refused) as refused:
            add(release, node.node)
        message = str(refused.value)
        assert refused.value.exit_code == 3 and "\n" not in message
        assert f"release 1.0.0 ({release})" in message and str(node.root / "etc") in message
        assert "--sign-key" in message and "nothing was stored" in message
        assert node.node.releases.versions() == []

    @pytest.mark.parametrize("how", ["another key", "another namespace"])
    def test_badly_signed_is_refused(self, node: World, tmp_path: Path,
                                     keys: dict[str, Path], how: str) -> None:
        """A release signed by a key the file does not list, or by a listed key for another
        purpose (namespace), is refused; nothing is stored."""
        if how == "another key":
            release = signed(tmp_path, keys["eve"])
        else:
            release = make_release(tmp_path)
            (release / signing.SIGNATURE).write_bytes(
                sshsig.sign(keys["ops"], "git", signing.message(release, stored=False)))
        with pytest.raises(Refused, match="does not verify against allowed_signers"):
            add(release, node.node)
        assert node.node.releases.versions() == []

    @pytest.mark.parametrize("change", ["a byte", "a mode", "a new file"])
    def test_a_change_after_signing_is_refused(self, node: World, tmp_path: Path,
                                               keys: dict[str, Path], change: str) -> None:
        """One byte, one mode or one file changed after the release was signed: refused."""
        release = signed(tmp_path, keys["ops"])
        template = release / "assets" / "agent.service"
        if change == "a byte":
            data = bytearray(template.read_bytes())
            data[-2] ^= 1
            template.write_bytes(bytes(data))
        elif change == "a mode":
            template.chmod(0o755)
        else:
            (release / "assets" / "extra").write_text("x\n")
        with pytest.raises(Refused, match="incorrect signature"):
            add(release, node.node)
        assert node.node.releases.versions() == []

    def test_no_allowed_signers_accepts_unsigned(self, world: World, tmp_path: Path) -> None:
        """Without `allowed_signers` in the config an unsigned release is stored, as before."""
        assert add(make_release(tmp_path), world.node).version == "1.0.0"

    @pytest.mark.parametrize("fault", ["missing", "a directory"])
    def test_unusable_allowed_signers_is_a_clear_error(self, node: World, tmp_path: Path,
                                                       keys: dict[str, Path], fault: str) -> None:
        """An allowed_signers file that is missing or cannot be read is an error (exit 1) naming
        it and what to do, not a refusal of the release; nothing is stored."""
        path = node.root / ALLOWED.relative_to("/")
        path.unlink()
        if fault == "a directory":
            path.mkdir()
        with pytest.raises(ConfigError) as error:
            add(signed(tmp_path, keys["ops"]), node.node)
        message = str(error.value)
        assert f"`allowed_signers` names {path}" in message and "\n" not in message
        assert ("does not exist" if fault == "missing" else "not a regular file") in message
        assert "ALLOWED SIGNERS" in message and node.node.releases.versions() == []

    def test_allowed_signers_is_checked_like_the_other_paths(self, tmp_path: Path) -> None:
        """`allowed_signers` must be an absolute, normalized path, as every path key."""
        for bad in ("allowed_signers", "/etc/../x", "/etc/a b"):
            with pytest.raises(ConfigError, match="`allowed_signers`"):
                parse({"allowed_signers": bad}, tmp_path / "config.toml")
        assert parse({"allowed_signers": str(ALLOWED)}, tmp_path).allowed_signers == ALLOWED


class TestDoctor:
    def test_doctor_verifies_stored_signatures_again(self, node: World, tmp_path: Path,
                                                     keys: dict[str, Path]) -> None:
        """doctor names who signed each stored release; once the signer's key is taken out of
        the file it fails that release, and warns about one stored unsigned earlier."""
        add(signed(tmp_path, keys["ops"]), node.node)
        [ok] = signatures(node.node)
        assert ok.level == "ok" and "1.0.0 (ops@example.com)" in ok.detail
        trusting(node.root, keys["eve"])  # ops revoked
        node.add_release("0.9.0")  # stored before signatures were required
        found = {f.detail.split()[1].split("'")[0]: f for f in signatures(node.node)}
        assert found["1.0.0"].level == "fail" and "no longer verifies" in found["1.0.0"].detail
        assert "release prune 1.0.0" in found["1.0.0"].fix
        assert found["0.9.0"].level == "warn" and "not signed" in found["0.9.0"].detail


class TestCommandLine:
    def test_pack_signs_and_add_refuses_unsigned(self, tmp_path: Path,
                                                 keys: dict[str, Path]) -> None:
        """`release pack --sign-key KEY` writes a release.sig the listed key made over the
        release; `release add` of an unsigned one exits 3 with one line on stderr."""
        root = tmp_path / "root"
        allowed = trusting(root, keys["ops"])
        cfg = tmp_path / "config.toml"
        cfg.write_text(f'allowed_signers = "{ALLOWED}"\n' + CONFIG)
        env = {k: v for k, v in os.environ.items() if k != "AGENT_FSM_CONFIG"}

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "agent_fsm", "--config", str(cfg),
                                   "--root", str(root), *args], cwd=ROOT, env=env, text=True,
                                  capture_output=True, timeout=120, check=False)

        packed = cli("release", "pack", "--version", "2.0.0", "--output", str(tmp_path / "rel"),
                     "--sign-key", str(keys["ops"]))
        assert packed.returncode == 0 and "signed with" in packed.stdout, packed.stderr
        release = tmp_path / "rel"  # verified here as `release add` would (storing 18 MB is slow)
        assert sshsig.verify(Path(allowed), signing.NAMESPACE, release / signing.SIGNATURE,
                             signing.message(release, stored=False)) == "ops@example.com"
        refused = cli("release", "add", str(make_release(tmp_path)))
        assert refused.returncode == 3 and refused.stderr.count("\n") == 1, refused.stderr
        assert "not signed" in refused.stderr and "Traceback" not in refused.stderr

    def test_list_shows_the_digest_pack_printed(self, tmp_path: Path,
                                                keys: dict[str, Path]) -> None:
        """For a signed release, the release digest CI saw (`release digest`, as `release
        pack` prints it) is on the node's `release list` line and in its --json
        `signed_digest`."""
        root = tmp_path / "root"
        trusting(root, keys["ops"])
        cfg = tmp_path / "config.toml"
        cfg.write_text(f'allowed_signers = "{ALLOWED}"\n' + CONFIG)
        env = {k: v for k, v in os.environ.items() if k != "AGENT_FSM_CONFIG"}

        def cli(*args: str) -> str:
            done = subprocess.run([sys.executable, "-m", "agent_fsm", "--config", str(cfg),
                                   "--root", str(root), *args], cwd=ROOT, env=env, text=True,
                                  capture_output=True, timeout=120, check=False)
            assert done.returncode == 0, done.stderr
            return done.stdout

        release = signed(tmp_path, keys["ops"])
        ci = cli("release", "digest", str(release)).strip()
        cli("release", "add", str(release))
        [line] = cli("release", "list").splitlines()
        assert line.startswith("1.0.0  ") and f"release.sig signs {ci}" in line, line
        [row] = json.loads(cli("release", "list", "--json"))
        assert row["signed_digest"] == ci and row["digest"] != ci
