"""`release pack` overlaps its slow parts: `lib/` is made on a thread beside the payload's copy,
and the payload's large files are hashed on workers while the next are copied. A failure on any
of those threads fails the pack with its error, leaves no thread running and nothing on disk."""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from agent_fsm.actions.releases import libcache, packing, trust
from agent_fsm.errors import ReleaseError
from agent_fsm.node.releases import bigcopy

BIG = (1 << 20) + 4097  # over the size a copy reads whole: copied by the kernel, hashed apart


def _ours() -> list[str]:
    """The pack's threads still alive."""
    return [t.name for t in threading.enumerate() if t.name.startswith("agent-fsm-")]


def _payload(where: Path, files: int = 3) -> Path:
    src = where / "payload"
    (src / "a").mkdir(parents=True)
    for i in range(files):
        (src / "a" / f"big{i}.bin").write_bytes(os.urandom(BIG))
    (src / "small.txt").write_text("small\n")
    return src


def _left(where: Path) -> list[str]:
    """What is in `where` beside the payload."""
    return sorted(set(os.listdir(where)) - {"payload"})


def test_a_hash_failing_on_its_worker_fails_the_pack_leaving_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read error while a worker hashes a copied file (the last one copied: no copy comes
    after it to notice) fails the pack in one line naming it, with no release, nothing beside
    where it would be, and no worker left."""
    src = _payload(tmp_path)
    real, threads = bigcopy.hashed, []

    def failing(fd: int, size: int, view: memoryview) -> str:
        threads.append(threading.current_thread().name)
        if os.readlink(f"/proc/self/fd/{fd}").endswith("/a/big2.bin"):
            raise OSError(errno.EIO, "Input/output error")
        return real(fd, size, view)

    monkeypatch.setattr(bigcopy, "hashed", failing)
    with pytest.raises(ReleaseError, match=r"^cannot pack --payload .*Input/output error"):
        packing.pack("1.0.0", tmp_path / "rel", payload=src)
    assert set(threads) == {"agent-fsm-hash"}
    assert _left(tmp_path) == []
    assert _ours() == []


def _failing_lib(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `lib/` fail once the payload's copy has begun."""
    copying = threading.Event()
    real: Callable[..., None] = packing.copy_payload

    def copy_payload(*args: object, **kwargs: object) -> None:
        copying.set()
        real(*args, **kwargs)

    def made(lib: Path, *_: object) -> bool:
        copying.wait(60)
        lib.mkdir()
        (lib / "half").write_text("")
        raise ReleaseError("cannot pack: lib/ broke")

    monkeypatch.setattr(packing, "copy_payload", copy_payload)
    monkeypatch.setattr(libcache, "made", made)


def test_lib_failing_while_the_payload_is_copied_fails_the_pack_leaving_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`lib/` failing while the payload is copied fails the pack with lib/'s error, leaving
    nothing and no thread."""
    _failing_lib(monkeypatch)
    with pytest.raises(ReleaseError, match=r"^cannot pack: lib/ broke$"):
        packing.pack("1.0.0", tmp_path / "rel", payload=_payload(tmp_path))
    assert _left(tmp_path) == []
    assert _ours() == []


def test_a_bad_payload_is_named_first_when_lib_fails_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the payload's copy and `lib/` both fail, the error shown is the payload's: that is
    the one the operator can fix."""
    _failing_lib(monkeypatch)
    src = _payload(tmp_path)
    os.mkfifo(src / "z-fifo")
    with pytest.raises(ReleaseError, match=r"^cannot pack --payload .*z-fifo is a FIFO"):
        packing.pack("1.0.0", tmp_path / "rel", payload=src)
    assert _left(tmp_path) == []
    assert _ours() == []


def test_a_payloads_large_files_and_directories_get_the_stores_modes(tmp_path: Path) -> None:
    """Large files hashed apart get the store's modes as small ones do: 0755 if executable by
    anyone, else 0644, directories 0755, whatever the source's; and the digest covers them."""
    src = _payload(tmp_path)
    modes = {"a/big0.bin": 0o700, "a/big1.bin": 0o600, "a/big2.bin": 0o666, "a": 0o700}
    for rel, mode in modes.items():
        (src / rel).chmod(mode)
    packed = packing.packed("1.0.0", tmp_path / "rel", payload=src)
    payload = packed.path / packing.PAYLOAD
    got = {rel: stat.S_IMODE((payload / rel).lstat().st_mode) for rel in modes}
    assert got == {"a/big0.bin": 0o755, "a/big1.bin": 0o644, "a/big2.bin": 0o644, "a": 0o755}
    assert (payload / "a" / "big1.bin").read_bytes() == (src / "a" / "big1.bin").read_bytes()
    assert packed.digest == trust.digest(packed.path)


def test_a_copy_failing_mid_tree_leaves_no_worker_running_and_nothing_behind(
        tmp_path: Path) -> None:
    """A payload refused after some large files were handed to the workers (a FIFO met later in
    the walk) fails the pack naming the FIFO, with every worker joined and nothing left."""
    src = _payload(tmp_path, files=bigcopy.PENDING + 3)
    os.mkfifo(src / "z-fifo")
    with pytest.raises(ReleaseError, match=r"z-fifo is a FIFO"):
        packing.pack("1.0.0", tmp_path / "rel", payload=src)
    assert _ours() == []
    assert _left(tmp_path) == []
