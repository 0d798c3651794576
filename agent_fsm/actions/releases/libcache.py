"""The `lib/` a pack makes, kept for the next pack with the same inputs: agent-fsm's package, its
vendored dependencies (`vendoring.vendor`) and the fast path's byte code (`compile_lean`). It
takes 0.4 s to make and 0.15 s to copy from here, and stays the same until a source file or the
interpreter changes.

An entry is keyed by the interpreter (version, byte-code magic, path) and the stat (path, device,
inode, size, mode, mtime, ctime) of every source file, so an edited, replaced or reinstalled file
makes another key. Entries live in a directory only this user may enter (`AGENT_FSM_CACHE_DIR`,
else /var/cache/agent-fsm for root, else `$XDG_CACHE_HOME/agent-fsm` or ~/.cache/agent-fsm), are
made whole in a private directory and renamed into place, and hold their tree's manifest.

A pack's `lib/` is a copy of the entry's files, never a link: a release edited in place changes
no other release and no entry. The copy is then hashed: a mismatch with the manifest refuses the
entry, which is made again, and the digest reuses the hashes. Entries are not synced: a torn one
is refused at its next use. A cache that is unsafe or unwritable is skipped, and the pack builds
`lib/` itself.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import sys
from collections.abc import Callable
from pathlib import Path

from ... import files
from ...errors import AgentFsmError, UnsafePath
from ...node.releases import store as release_store
from ...node.releases import tree
from ...node.sha256 import sha256

ENV = "AGENT_FSM_CACHE_DIR"
KEEP = 4  # entries kept: the newest by mtime
_MANIFEST = "manifest"


def cache_dir() -> Path:
    """Where the entries are kept (see the module's docstring)."""
    given = os.environ.get(ENV)
    return Path(given) if given else default_dir()


def default_dir() -> Path:
    """Where the entries are kept when `AGENT_FSM_CACHE_DIR` is not set."""
    if os.geteuid() == 0:
        return Path("/var/cache/agent-fsm")
    home = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(home) / "agent-fsm"


def key(sources: list[tuple[Path, str]]) -> str:
    """The key of a `lib/` made from `sources` (each a file and its path in `lib/`) by this
    interpreter."""
    h = sha256()
    h.update(f"lib v1\n{sys.version}\n{sys.executable}\n".encode())
    h.update(importlib.util.MAGIC_NUMBER)
    for source, rel in sources:
        st = os.stat(source)
        h.update(f"{rel}\0{st.st_dev} {st.st_ino} {st.st_size} {st.st_mode} {st.st_mtime_ns} "
                 f"{st.st_ctime_ns}\n".encode())
    return h.hexdigest()


def _manifest(lib: Path, hashed: tree.Hashed) -> bytes:
    """The manifest of `lib`, its files' hashes put in `hashed` (fresh ones too: no other user
    can enter the cache or the release being packed)."""
    return release_store.manifest(tree.scan(lib, stored=False, hashed=hashed, fresh=True))


def _copy(src: str, dst: str) -> None:
    """`dst` a new file with the bytes and mode of `src` (its own inode: see the module)."""
    shutil.copyfile(src, dst)
    shutil.copymode(src, dst)


def _share(src: Path, dst: Path) -> None:
    """The tree `src` as the new tree `dst`: its directories and files made anew."""
    shutil.copytree(src, dst, copy_function=_copy)


def _root() -> Path | None:
    """The cache directory, made 0700 if missing; None when it is not this user's alone."""
    root = cache_dir()
    try:
        files.ensure_dir(root.parent)
        files.ensure_dir(root, 0o700)
        files.trusted_dir(root)
        st = os.lstat(root)
    except (AgentFsmError, OSError):
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        return None
    return root


def made(lib: Path, sources: list[tuple[Path, str]], build: Callable[[Path], None],
         hashed: tree.Hashed | None = None) -> bool:
    """Make `lib` (a new directory's path): copied from the cached entry for `sources` when it is
    intact, else `build(lib)` (which leaves every mode the store's), then kept as that entry.
    `hashed`: given the hashes of `lib`'s files, keyed as `tree.scan` keys them below `lib`.
    Whether the cache served it."""
    root = _root()
    if root is None:
        build(lib)
        return False
    entry = root / f"lib-{key(sources)}"
    seen: tree.Hashed = {}
    try:
        want = (entry / _MANIFEST).read_bytes()
        _share(entry / "lib", lib)
        if _manifest(lib, seen) == want:
            os.utime(entry)  # the newest is kept longest
            if hashed is not None:
                hashed.update(seen)
            return True
        shutil.rmtree(lib)
    except (OSError, AgentFsmError):
        if lib.exists():
            shutil.rmtree(lib)
    build(lib)
    _keep(root, entry, lib, hashed)
    return False


def _keep(root: Path, entry: Path, lib: Path, hashed: tree.Hashed | None) -> None:
    """Keep a copy of `lib` as `entry`, whole or not at all, its files' hashes put in
    `hashed`; the oldest entries beyond KEEP go."""
    seen: tree.Hashed = {}
    try:
        with files.private_dir(root, ".making.") as tmp:
            _share(lib, tmp / "lib")
            (tmp / _MANIFEST).write_bytes(_manifest(tmp / "lib", seen))
            if entry.exists():
                shutil.rmtree(entry)
            os.replace(tmp, entry)
            tmp.mkdir(0o700)  # for `private_dir` to remove
        if hashed is not None:
            hashed.update(seen)
        entries = sorted((e for e in root.iterdir() if e.name.startswith("lib-")),
                         key=lambda e: e.stat().st_mtime_ns, reverse=True)
        for old in entries[KEEP:]:
            shutil.rmtree(old, ignore_errors=True)
    except (OSError, AgentFsmError, UnsafePath):
        return  # a cache that cannot be written is done without
