"""What a release's signature covers: the release's digest without `release.sig`, in the
`agent-fsm-release` namespace.

The signed message is the ASCII text `sha256:<hex>`, with no newline. It is the digest of every
path, mode and byte (`release_store.manifest`), `release.sig` left out, with the modes the store
gives; `release digest DIR` prints it. So a signature made at `release pack` or `release sign`
verifies on the copy `release add` stores, and by hand:

    printf %s "$(agent-fsm release digest DIR)" | ssh-keygen -Y verify -f allowed_signers \\
        -I PRINCIPAL -n agent-fsm-release -s DIR/release.sig

The digest the store records (and `release add` prints) covers `release.sig` too. It equals the
signed one only for an unsigned release.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ... import files
from ...errors import ConfigError
from ..config import Config
from ..paths import Paths
from ..store_config import DEFAULTS
from . import bytecode
from . import store as release_store
from .tree import Hashed, scan

SIGNATURE = "release.sig"
NAMESPACE = "agent-fsm-release"
MAX_SIGNATURE_BYTES = 64 << 10  # an armored SSH signature is under 2 KiB; an RSA certificate more


def message(release: Path, *, stored: bool, hashed: Hashed | None = None) -> bytes:
    """The message a release's signature signs: its digest without `release.sig`.

    `stored`: a stored or staged copy, checked as the store holds it, less the node's byte code
    (`bytecode`). Else a packed directory, its modes taken as the store will give them, within the
    default ceilings (`store_config.DEFAULTS`).
    `hashed`: files this process hashed as it wrote them, in a directory only it may write
    (`tree.scan`); they are not read again.
    """
    entries = [e for e in scan(release, stored=stored, normalize=not stored, hashed=hashed,
                               limits=None if stored else DEFAULTS)
               if e.path != SIGNATURE]
    if stored:  # the byte code `release add` wrote for the node is not the release's
        extra = set(bytecode.recorded(release.parent, release.name).splitlines(keepends=True))
        entries = [e for e in entries if e.line() not in extra]
    return release_store.digest(release_store.manifest(entries)).encode("ascii")


def signed_digest(manifest_bytes: bytes) -> str | None:
    """The digest a stored release's `release.sig` signs, from its recorded manifest less its own
    line (what `message` computes); None when it has none."""
    line = f" {SIGNATURE}\n".encode()
    entries = manifest_bytes.splitlines(keepends=True)
    kept = [e for e in entries if not (e.startswith(b"f ") and e.endswith(line)
                                       and e.count(b" ") == 4)]
    return None if len(kept) == len(entries) else release_store.digest(b"".join(kept))


def signature(release: Path) -> Path | None:
    """The release's `release.sig`, or None when it has none. Raises ValueError when it is not
    a regular file within MAX_SIGNATURE_BYTES."""
    path = release / SIGNATURE
    try:
        files.read_regular(path, MAX_SIGNATURE_BYTES)
    except FileNotFoundError:
        return None
    return path


def allowed_signers(config: Config, paths: Paths) -> Path | None:
    """The config's allowed-signers file (below --root, if given), checked to be a readable regular
    file; None when the config names none. ConfigError otherwise."""
    if config.allowed_signers is None:
        return None
    path = paths.real(config.allowed_signers)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError("it is not a regular file")
            os.read(fd, 1)
        finally:
            os.close(fd)
    except OSError as exc:
        why = "does not exist" if isinstance(exc, FileNotFoundError) else f"cannot be read ({exc})"
        raise ConfigError(
            f"config {config.source or paths.host_config}: `allowed_signers` names {path}, which "
            f"{why}; write the trusted signers' public keys there (ssh-keygen(1), ALLOWED SIGNERS: "
            f"`PRINCIPAL namespaces=\"{NAMESPACE}\" KEYTYPE KEY`), or remove the key to accept "
            "unsigned releases") from None
    return path
