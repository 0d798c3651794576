"""Trusted signers: `release pack --sign-key` signs a release, and `release add` refuses one no
key of the config's `allowed_signers` signed, when the config names that file.

The signature is OpenSSH's (`ssh-keygen -Y sign`, checked with `-Y find-principals` and
`-Y verify` against an allowed-signers file, `system.sshsig`) over the release's digest
(`node.signing`): agent-fsm does no cryptography of its own.
"""

from __future__ import annotations

from pathlib import Path

from ...errors import BadSignature, BadTree, ConfigError, CouldNotRun, Refused, ReleaseError
from ...node.config import Config
from ...node.paths import Paths
from ...node.releases import signing
from ...system import sshsig

_AFTER = "nothing was stored"


def sign(release: Path, key: Path) -> str:
    """Sign a packed release directory with `key` (a private key file, or a public one whose
    private half is in ssh-agent): write its `release.sig`. Returns the signed digest."""
    message = signing.message(release, stored=False)
    try:
        signature = sshsig.sign(key, signing.NAMESPACE, message)
    except (BadSignature, CouldNotRun) as exc:
        raise ReleaseError(f"could not sign the release with {key}: {exc}; give a private key "
                           "file, or a public key whose private half is in ssh-agent") from None
    (release / signing.SIGNATURE).write_bytes(signature)
    return message.decode("ascii")


def check(release: Path, version: str, config: Config, paths: Paths) -> str | None:
    """Refuse (Refused, exit 3) a staged release that no key of the config's allowed signers
    signed; return the signer's principal, or None when the config requires no signature."""
    try:
        allowed = signing.allowed_signers(config, paths)
    except ConfigError as exc:
        raise ConfigError(f"{exc}; {_AFTER}") from None
    if allowed is None:
        return None
    what = f"release {version} ({release})"
    try:
        sig = signing.signature(release)
    except ValueError as exc:
        raise ReleaseError(f"refusing {what}: its {signing.SIGNATURE} cannot be read: {exc}; "
                           + _AFTER) from None
    if sig is None:
        raise Refused(
            f"refusing {what}: it is not signed, and the config's allowed_signers {allowed} "
            f"requires a {signing.SIGNATURE} made by one of its keys; pack it with `agent-fsm "
            "release pack --sign-key KEY` (KEY: a key listed there), or remove `allowed_signers` "
            "from the config to accept unsigned releases; " + _AFTER)
    try:
        return sshsig.verify(allowed, signing.NAMESPACE, sig,
                             signing.message(release, stored=True))
    except BadSignature as exc:
        raise Refused(
            f"refusing {what}: its {signing.SIGNATURE} does not verify against allowed_signers "
            f"{allowed}: {exc}; it was signed by a key not listed there, for another namespace "
            f"than {signing.NAMESPACE}, or the release changed after it was signed: pack and sign "
            "it again with a listed key (`agent-fsm release pack --sign-key KEY`); "
            + _AFTER) from None
    except CouldNotRun as exc:
        raise ReleaseError(f"cannot check the signature of {what}: {exc.reason}; install "
                           "OpenSSH's ssh-keygen (Debian: openssh-client); " + _AFTER) from None
    except BadTree as exc:
        raise ReleaseError(f"refusing {what}: {exc}; " + _AFTER) from None
