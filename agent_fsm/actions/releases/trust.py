"""Trusted signers. `release pack --sign-key` signs a release, and `release sign` a packed one
again. When the config names `allowed_signers`, `release add` refuses a release no key in it signed.

The signature is OpenSSH's over the release's digest (`node.signing`): `ssh-keygen -Y sign`, checked
with `-Y find-principals` and `-Y verify` against an allowed-signers file (`system.sshsig`).
agent-fsm does no cryptography of its own.
"""

from __future__ import annotations

from pathlib import Path

from ... import files
from ...errors import BadSignature, BadTree, ConfigError, CouldNotRun, Refused, ReleaseError
from ...node.config import Config
from ...node.paths import Paths
from ...node.releases import signing
from ...node.releases import store as release_store
from ...node.releases.pointers import read_manifest
from ...node.releases.tree import Hashed
from ...system import sshsig

_AFTER = "nothing was stored"


def digest(release: Path, hashed: Hashed | None = None) -> str:
    """The digest a signature of `release` covers (`signing.message`, `hashed` as there),
    `sha256:<hex>`, as `release digest` prints it. ReleaseError names an entry the store would
    refuse."""
    try:
        return signing.message(release, stored=False, hashed=hashed).decode("ascii")
    except BadTree as exc:
        raise ReleaseError(f"{exc}; a release holds regular files and directories only, within "
                           "the store's limits (docs/operations.md, Releases)") from None


def sign(release: Path, key: Path, hashed: Hashed | None = None) -> str:
    """Sign a packed release directory with `key`, writing or replacing its `release.sig`
    atomically. `key` is a private key file, or a public one whose private half is in ssh-agent.
    Returns the signed digest (`hashed` as `digest` takes it)."""
    message = digest(release, hashed).encode("ascii")
    try:
        signature = sshsig.sign(key, signing.NAMESPACE, message)
    except (BadSignature, CouldNotRun) as exc:
        raise ReleaseError(f"could not sign the release with {key}: {exc}; give a private key "
                           "file, or a public key whose private half is in ssh-agent") from None
    files.atomic_write(release / signing.SIGNATURE, signature, 0o644)
    return message.decode("ascii")


def packed(directory: Path, *, signing_it: bool = False) -> str:
    """The version of the release directory `directory` (as `release pack` makes one). ReleaseError,
    one line, when it is missing, not a directory or not a release. With `signing_it`, also when it
    is in a store: signing would change a stored release and make it DAMAGED."""
    if not directory.exists():
        raise ReleaseError(f"release directory {directory} does not exist; give a directory "
                           "made by `agent-fsm release pack --output DIR`")
    if not directory.is_dir():
        raise ReleaseError(f"{directory} is not a directory: give a release directory (from "
                           "`agent-fsm release pack`); unpack an archive first")
    try:
        version = read_manifest(directory / "release.toml").version
    except FileNotFoundError:
        raise ReleaseError(f"{directory} is not a release: {directory / 'release.toml'} is "
                           "missing; give a directory made by `agent-fsm release pack`") from None
    if signing_it and (directory.resolve().parent / release_store.DIGESTS).is_dir():
        raise ReleaseError(
            f"{directory} is a stored release (in {directory.resolve().parent}): signing it "
            "there would change it after it was added; sign the directory it was added from, "
            f"then remove this copy (`agent-fsm release prune {version}`) and add the signed "
            "one")
    return version


def check(release: Path, version: str, config: Config, paths: Paths) -> str | None:
    """Refuse (Refused, exit 3) a staged release no key of the config's allowed signers signed.
    Returns the signer's principal, or None when the config requires no signature."""
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
            f"requires a {signing.SIGNATURE} made by one of its keys; sign it with `agent-fsm "
            "release sign DIR --sign-key KEY` (or pack it with --sign-key KEY; KEY: a key listed "
            "there), or remove `allowed_signers` "
            "from the config to accept unsigned releases; " + _AFTER)
    try:
        return sshsig.verify(allowed, signing.NAMESPACE, sig,
                             signing.message(release, stored=True))
    except BadSignature as exc:
        raise Refused(
            f"refusing {what}: its {signing.SIGNATURE} does not verify against allowed_signers "
            f"{allowed}: {exc}; it was signed by a key not listed there, for another namespace "
            f"than {signing.NAMESPACE}, or the release changed after it was signed: pack and sign "
            "it again with a listed key (`agent-fsm release pack --sign-key KEY`, or `release "
            "sign DIR --sign-key KEY` once you know what changed); "
            + _AFTER) from None
    except CouldNotRun as exc:
        raise ReleaseError(f"cannot check the signature of {what}: {exc.reason}; install "
                           "OpenSSH's ssh-keygen (Debian: openssh-client); " + _AFTER) from None
    except BadTree as exc:
        raise ReleaseError(f"refusing {what}: {exc}; " + _AFTER) from None
