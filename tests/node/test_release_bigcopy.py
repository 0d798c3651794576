"""A large file's copy (`bigcopy`): the kernel copies it, a second thread hashes the bytes
written, and a file grown past its ceiling is refused there, not copied on."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from agent_fsm.actions.releases import packing, trust
from agent_fsm.node.releases import bigcopy


class OverCeiling(Exception):
    pass


def _random(path: Path, size: int) -> bytes:
    data = os.urandom(size)
    path.write_bytes(data)
    return data


def _copy(src: Path, dst: Path, most: int) -> tuple[str, int]:
    """`bigcopy.copy` of `src` into the new file `dst`, refusing (OverCeiling) past `most`
    bytes as `bigcopy.stored` refuses past a file's ceiling."""
    copied = 0

    def counted(n: int) -> None:
        nonlocal copied
        copied += n
        if copied > most:
            raise OverCeiling(copied)

    fd = os.open(src, os.O_RDONLY)
    try:
        out = os.open(dst, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            return bigcopy.copy(fd, out, most, counted)
        finally:
            os.close(out)
    finally:
        os.close(fd)


def _hashers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "agent-fsm-hash"]


class TestCopy:
    def test_a_file_of_many_stretches_is_copied_whole_and_hashed_as_written(
            self, tmp_path: Path) -> None:
        """A file of several stretches (and a few bytes more) is copied byte for byte, and
        the hash returned is the SHA-256 of the copy's bytes."""
        data = _random(tmp_path / "src", 2 * bigcopy.STRETCH + 12_345)
        sha, size = _copy(tmp_path / "src", tmp_path / "dst", 1 << 40)
        assert (tmp_path / "dst").read_bytes() == data
        assert (sha, size) == (hashlib.sha256(data).hexdigest(), len(data))
        assert _hashers() == []

    def test_a_file_grown_past_its_ceiling_is_refused_one_byte_over_it(
            self, tmp_path: Path) -> None:
        """A file longer than its ceiling when copied (one appended to after its size was
        checked) is refused with at most one byte over the ceiling written: the copy neither
        runs on a stretch past it nor ends at the ceiling as if the file ended there."""
        most = (2 << 20) + 7
        _random(tmp_path / "src", bigcopy.STRETCH + (4 << 20))
        with pytest.raises(OverCeiling):
            _copy(tmp_path / "src", tmp_path / "dst", most)
        assert (tmp_path / "dst").stat().st_size == most + 1
        assert _hashers() == []


def test_a_packed_payloads_large_files_are_in_its_digest_as_copied(tmp_path: Path) -> None:
    """`release pack` of a payload holding files of many stretches makes a release with them
    byte for byte, and the digest it returns is the one its files hash to afresh."""
    payload = tmp_path / "payload"
    payload.mkdir()
    data = {name: _random(payload / name, size) for name, size in (
        ("big.bin", bigcopy.STRETCH + 1), ("bigger.bin", 2 * bigcopy.STRETCH + 3))}
    packed = packing.packed("1.0.0", tmp_path / "rel", payload=payload)
    for name, content in data.items():
        assert (packed.path / packing.PAYLOAD / name).read_bytes() == content
    assert packed.digest == trust.digest(packed.path)
