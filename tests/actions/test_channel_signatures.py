"""A channel's signatures with real ssh-keygen keys: a document signed by a key the root names
verifies, and a changed byte, another key or another namespace does not."""

from __future__ import annotations

import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent_fsm.actions.channel import signatures
from agent_fsm.errors import ChannelError
from agent_fsm.node.channel import documents as docs
from agent_fsm.node.channel import trust
from agent_fsm.node.channel.documents import Entry, Index, Role, Root

pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None,
                                reason="needs OpenSSH's ssh-keygen (Debian: openssh-client)")


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f",
                    str(path)], check=True, timeout=30)
    return path


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("keys")
    return {n: keygen(d / n) for n in ("online", "stranger")}


def test_a_signed_index_is_believed_and_a_changed_one_is_not(keys: dict[str, Path]) -> None:
    """ssh-keygen verifies the online key's signature of an index; the same bytes with one
    version's rollout raised, or signed by another key under the online key's name, do not."""
    now = datetime.now(UTC).replace(microsecond=0)  # the documents keep whole seconds
    root = Root(1, now + timedelta(days=1), {"online": signatures.public_key(keys["online"])},
                Role(("online",), 1), Role(("online",), 1))
    index = Index("stable", 1, now + timedelta(days=1),
                  (Entry("1.0.0", "sha256:" + "0" * 64, 10, image="docker://r/a:1"),))
    data = signatures.sign(index.to_json(), {"online": keys["online"]})

    def believe(data: bytes) -> Index:
        return trust.accept_index(root, docs.read_envelope(data, "the index"), channel="stable",
                                  seen=None, now=now, check=signatures.check)

    assert believe(data) == index
    with pytest.raises(ChannelError, match="0 good signatures"):
        believe(data.replace(b'"rollout":10', b'"rollout":100'))
    with pytest.raises(ChannelError, match="0 good signatures"):
        believe(signatures.sign(index.to_json(), {"online": keys["stranger"]}))


def test_a_release_signature_is_no_channel_signature(keys: dict[str, Path]) -> None:
    """A signature of the same message in the releases' namespace does not verify as a
    channel's."""
    from agent_fsm.system import sshsig

    message = docs.message(b"{}")
    sig = sshsig.sign(keys["online"], "agent-fsm-release", message.encode()).decode()
    assert not signatures.check(message, "online", signatures.public_key(keys["online"]), sig)
    good = sshsig.sign(keys["online"], docs.NAMESPACE, message.encode()).decode()
    assert signatures.check(message, "online", signatures.public_key(keys["online"]), good)
