"""A channel's signatures, made and checked by ssh-keygen in the `agent-fsm-channel` namespace. This
is the `Check` given to `node.channel.trust`, and the signing of a document with a key file.

Each check writes a one-line allowed-signers file naming only the key the root lists under that
name. So a signature verifies only as the key the root trusts for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ... import files
from ...errors import BadSignature, ChannelError, CouldNotRun
from ...node.channel import documents
from ...node.channel.documents import NAMESPACE, Signature
from ...system import sshsig


def check(message: str, name: str, public_key: str, sig: str) -> bool:
    """Whether `sig` is `public_key`'s signature of `message` in the channel's namespace."""
    with files.private_dir(prefix="agent-fsm-channel.") as tmp:
        allowed = tmp / "allowed_signers"
        allowed.write_text(f'{name} namespaces="{NAMESPACE}" {public_key}\n')
        signature = tmp / "signature"
        signature.write_text(sig)
        try:
            sshsig.verify(allowed, NAMESPACE, signature, message.encode("ascii"))
        except BadSignature:
            return False
        except CouldNotRun as exc:
            raise ChannelError(f"could not check the channel's signatures: {exc}") from None
    return True


def sign(body: Mapping[str, Any], keys: Mapping[str, Path]) -> bytes:
    """`body` as a document signed by each named key, as bytes to publish. A key is a private key
    file, or a public one whose private half is in ssh-agent."""
    message = documents.message(documents.canonical(body)).encode("ascii")
    signatures = []
    for name, key in keys.items():
        try:
            sig = sshsig.sign(key, NAMESPACE, message).decode("ascii")
        except BadSignature as exc:
            raise ChannelError(f"could not sign with key {name} ({key}): {exc}") from None
        signatures.append(Signature(name, sig))
    return documents.envelope(body, tuple(signatures))


def public_key(key: Path) -> str:
    """The public key (`TYPE BASE64`) of a key file: `KEY.pub` beside a private key, or the file
    itself if public."""
    pub = key if key.suffix == ".pub" else key.with_name(key.name + ".pub")
    try:
        words = pub.read_text(encoding="ascii").split()
    except (OSError, ValueError) as exc:
        raise ChannelError(f"cannot read the public key {pub}: {exc}") from None
    text = " ".join(words[:2])
    if len(words) < 2 or not documents.KEY_RE.fullmatch(text):
        raise ChannelError(f"{pub} is not an OpenSSH public key")
    return text
