"""A node's files as a value: taken from a directory, put back into one, and digested.

One explored configuration keeps its node's files as a `Tree` (every regular file's bytes and
mode, every symlink's target, every directory, and which names are one file: the release
store's hard links, whose link count is its refcount); the next process step puts it back into
the work directory and runs real code on it. The digest leaves out what changes no behaviour the
check looks at (the history journal, the state file's checksum, sequence number and counters,
the store's cache of hashes by inode, `releases/.hashed/`), so that two configurations that
differ only in their history are one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Left out of the digest: written, never read back by a decision the check explores.
_UNDIGESTED = ("history.jsonl",)
_UNDIGESTED_DIRS = ("/.hashed/",)  # a cache keyed by inode numbers: new ones at every put
_STATE_VOLATILE = ("checksum", "seq", "counters", "last_transition")
_BYTES: dict[bytes, bytes] = {}  # one copy of each file content, shared by every tree
_ON_DISK: dict[Path, Tree] = {}  # what each work directory holds, as last taken or put


@dataclass(frozen=True)
class Tree:
    # (relative path, kind "d" | "f" | "l" | "h", bytes or link target, mode), sorted by path;
    # "h": another name of the file at the path its bytes give (a hard link)
    entries: tuple[tuple[str, str, bytes, int], ...]

    @classmethod
    def take(cls, root: Path) -> Tree:
        out: list[tuple[str, str, bytes, int]] = []
        linked: dict[tuple[int, int], list[tuple[str, str]]] = {}  # inode -> (name, path)
        stack = [("", str(root))]
        while stack:
            rel_dir, real_dir = stack.pop()
            with os.scandir(real_dir) as it:
                for e in it:
                    rel = f"{rel_dir}{e.name}"
                    st = e.stat(follow_symlinks=False)
                    if stat.S_ISLNK(st.st_mode):
                        out.append((rel, "l", os.readlink(e.path).encode(), 0))
                    elif stat.S_ISDIR(st.st_mode):
                        out.append((rel, "d", b"", stat.S_IMODE(st.st_mode)))
                        stack.append((rel + "/", e.path))
                    elif stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                        linked.setdefault((st.st_dev, st.st_ino), []).append((rel, e.path))
                    elif stat.S_ISREG(st.st_mode):
                        with open(e.path, "rb") as f:
                            data = f.read()
                        out.append((rel, "f", _BYTES.setdefault(data, data),
                                    stat.S_IMODE(st.st_mode)))
        for names in linked.values():  # the first name holds the bytes, the others link to it
            names.sort()
            first, path = names[0]
            with open(path, "rb") as f:
                data = f.read()
            mode = stat.S_IMODE(os.lstat(path).st_mode)
            out.append((first, "f", _BYTES.setdefault(data, data), mode))
            out.extend((rel, "h", first.encode(), mode) for rel, _ in names[1:])
        tree = cls(tuple(sorted(out)))
        _ON_DISK[root] = tree
        return tree

    def put(self, root: Path) -> None:
        """Make `root` hold exactly this tree: from the tree last taken or put there, only what
        differs is removed and written (a step changes a few files)."""
        now = _ON_DISK.get(root)
        if now is None or not root.exists():
            if root.exists():
                shutil.rmtree(root)
            root.mkdir(parents=True)
            now = Tree(())
        have = {e[0]: e for e in now.entries}
        want = {e[0]: e for e in self.entries}
        changed = {r for r in have if want.get(r) != have[r]}
        # a link whose file is written anew is linked anew (same entry, another inode)
        changed |= {r for r, e in have.items() if e[1] == "h" and e[2].decode() in changed}
        for rel in sorted(changed, reverse=True):
            path = root / rel
            if have[rel][1] == "d":
                if want.get(rel, ("", ""))[1] == "d":  # only its mode differs
                    continue
                shutil.rmtree(path)
            else:
                path.unlink()
        for rel, kind, data, mode in self.entries:  # sorted: a directory before its entries
            if rel not in changed and have.get(rel) == (rel, kind, data, mode):
                continue
            path = root / rel
            if kind == "d" and path.is_dir() and not path.is_symlink():
                os.chmod(path, mode)
                continue
            if kind == "d":
                path.mkdir(mode=0o700)
                os.chmod(path, mode)
            elif kind == "l":
                path.symlink_to(data.decode())
            elif kind == "h":
                os.link(root / data.decode(), path)
            else:
                path.write_bytes(data)
                os.chmod(path, mode)
        _ON_DISK[root] = self

    def file(self, rel: str) -> bytes | None:
        for r, kind, data, _ in self.entries:
            if r == rel and kind == "f":
                return data
        return None

    def digest(self, cap: int) -> str:
        """`cap`: the signal's counts above it behave as it (max_attempts + 1: refused)."""
        h = hashlib.sha256()
        for rel, kind, data, mode in self.entries:
            name = rel.rsplit("/", 1)[-1]
            if name in _UNDIGESTED or any(d in f"/{rel}" for d in _UNDIGESTED_DIRS):
                continue
            if name == "state.json" and kind == "f":
                data = _normalized(data, _STATE_VOLATILE, {})
            elif name == "upgrade-signal.json" and kind == "f":
                data = _normalized(data, ("checksum",), {"starts": cap, "attempt": cap})
            h.update(f"{rel}\0{kind}\0{mode}\0{len(data)}\0".encode())
            h.update(data)
        return h.hexdigest()


def _normalized(data: bytes, volatile: tuple[str, ...], caps: dict[str, int]) -> bytes:
    try:
        doc = json.loads(data)
    except ValueError:
        return data  # damaged: its bytes are the state
    if not isinstance(doc, dict):
        return data
    inner = doc.get("body")
    body: dict[str, Any] = inner if isinstance(inner, dict) else doc
    for key in volatile:
        doc.pop(key, None)
        body.pop(key, None)
    for key, cap in caps.items():
        if isinstance(body.get(key), int):
            body[key] = min(body[key], cap)
    return json.dumps(doc, sort_keys=True).encode()
