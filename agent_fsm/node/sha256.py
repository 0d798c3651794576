"""The one SHA-256 agent-fsm hashes with: CPython's own unless this process has OpenSSL loaded.

`hashlib.sha256` is OpenSSL's, and importing `hashlib` maps libcrypto into the process. That costs
4.5-9 ms of each `status --json`, which hashes only the state file (a few KB), and puts the figure
at its goal's edge (docs/benchmarks.md, "What each mechanism buys"). CPython's built-in one
(`_sha256` up to 3.11, `_sha2` from 3.12) gives the same digests but is slower on large inputs: 98
ms for 18 MiB, against OpenSSL's 16 ms on a CPU with SHA instructions. `release add`, and `upgrade`,
`install` and `activate` reading every byte of their release (`Releases.reread`), hash a whole tree
once in a short-lived process and ask for OpenSSL's (`prefer_openssl`). OpenSSL's is also used
whenever the process has loaded it anyway (the full CLI's libraries do). It is asked of `_hashlib`,
since `hashlib` may be bound to CPython's digests even then (the writers' lock imports filelock
without OpenSSL).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, cast


class Hash(Protocol):
    def update(self, data: bytes, /) -> None: ...

    def hexdigest(self) -> str: ...


def _builtin() -> Callable[[], Hash] | None:
    try:
        from _sha256 import sha256 as builtin  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        try:
            from _sha2 import sha256 as builtin  # type: ignore[import-not-found,no-redef,unused-ignore]
        except ImportError:
            return None  # an interpreter built without it
    return builtin  # type: ignore[no-any-return,unused-ignore]


_BUILTIN = _builtin()


def sha256() -> Hash:
    """A new SHA-256 hash object (`update`, `hexdigest`)."""
    openssl = sys.modules.get("_hashlib")
    if openssl is not None:
        return cast(Hash, openssl.openssl_sha256())
    if _BUILTIN is None:
        import hashlib

        return hashlib.sha256()
    return _BUILTIN()


def prefer_openssl() -> None:
    """Load OpenSSL's SHA-256 for this process's hashing from here on. For a short-lived process
    about to hash a whole release (`release add`): speed counts there, memory does not."""
    with contextlib.suppress(ImportError):  # an interpreter without OpenSSL keeps its own
        import _hashlib  # noqa: F401  (loading it is the point: `sha256` then picks it)


def of_file(path: Path, chunk: int = 1 << 20) -> tuple[str, int]:
    """The SHA-256 (64 hex digits) and size of the file at `path`, read a chunk at a time. OSError
    as it comes."""
    h, size = sha256(), 0
    with path.open("rb") as f:
        while data := f.read(chunk):
            h.update(data)
            size += len(data)
    return h.hexdigest(), size


def hexdigest(data: bytes) -> str:
    """The SHA-256 of `data`, as 64 lowercase hex digits."""
    h = sha256()
    h.update(data)
    return h.hexdigest()
