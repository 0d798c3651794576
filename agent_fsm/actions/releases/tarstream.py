"""A release archive read as a stream: tar members one at a time, bounded by what is read, not
by what headers declare.

It reads ustar headers (POSIX and GNU), pax extended headers (`path`, `linkpath`, `size`) and
GNU long names, plain or gzip, bzip2 or xz. The bounds:

- extended data is read only up to EXTENDED_MAX, and counts against `max_bytes`;
- at most one extended header of each kind precedes a member; reading never recurses;
- every other header is a member, counted against `max_members`; nothing of a member is kept
  once the next is read;
- the first zero block ends the archive.

So at most `max_bytes` and a few blocks a member are decompressed. A refusal is a BadArchive in
one clause.
"""

from __future__ import annotations

import bz2
import gzip
import io
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ...errors import BadArchive
from ...node.store_config import raise_key, size_text

try:  # a Python built without lzma reads no .tar.xz (BadArchive says so)
    import lzma
except ImportError:  # pragma: no cover
    lzma = None  # type: ignore[assignment]

BLOCK = 512
EXTENDED_MAX = 64 << 10  # one pax or long-name header's data
CHUNK = 1 << 16
FILE, DIRECTORY, SPARSE = b"0", b"5", b"S"
_ZERO = bytes(BLOCK)
# Links, devices, directories and FIFOs: no data follows their header, whatever its size says.
_NO_DATA = frozenset(bytes([c]) for c in b"123456")
_EXTENDED = {b"x": "pax", b"X": "pax", b"L": "GNU long-name", b"K": "GNU long-link-name"}
_GLOBAL = b"g"
_POSIX_MAGIC = b"ustar\0"
_SIGNED = struct.Struct("148b8x356b")
_Damaged = Callable[[str, int], BadArchive]  # the error for why, at an offset
NOT_TAR = "it is not a tar archive (plain, or compressed with gzip, bzip2 or xz)"
# What a damaged compressed stream raises, by its compression (bz2 and gzip: OSError, no errno).
_CORRUPT: tuple[type[Exception], ...] = (EOFError, zlib.error) + (
    () if lzma is None else (lzma.LZMAError,))


@dataclass(frozen=True)
class Member:
    """One member as its headers give it.

    `kind` is the tar type flag (FILE, DIRECTORY, SPARSE); `size` the data's bytes; names are
    UTF-8 with surrogates; `offset` where its first header starts, uncompressed.
    """

    name: str
    kind: bytes
    mode: int
    size: int
    linkname: str
    offset: int


class Reader:
    """The members of the tar stream in `raw`, within `max_members` and `max_bytes`."""

    def __init__(self, raw: io.BufferedReader, *, max_members: int, max_bytes: int) -> None:
        self._src = _decompressed(raw)
        self._raw = raw
        self.max_members, self.max_bytes = max_members, max_bytes
        self.position = 0  # bytes of the uncompressed stream read
        self.counted = 0  # bytes of data and extended headers
        self._members = 0
        self._left = 0  # data of the last member not read yet
        self._padding = 0

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *_: object) -> None:
        if self._src is not self._raw:
            self._src.close()

    def members(self) -> Iterator[Member]:
        """Each member in turn; data `data` did not read is skipped before the next."""
        pending: dict[bytes, tuple[int, bytes]] = {}  # extended headers for the next member
        while True:
            self._pass_over()
            offset = self.position
            block = self._read(BLOCK, at_header=True)
            if block == b"" and offset == 0:
                raise BadArchive(NOT_TAR)
            if block in (b"", _ZERO):
                if pending:
                    kind, (at, _) = next(iter(pending.items()))
                    raise self._damaged(f"its {_EXTENDED[kind]} header at byte {at} is for no "
                                        "member (the archive ends after it)", at)
                return
            name, kind, mode, size, linkname = _fields(block, self._damaged, offset)
            if kind in _EXTENDED:
                key = b"x" if kind == b"X" else kind
                if key in pending:
                    raise BadArchive(f"its {_EXTENDED[kind]} header at byte {offset} follows "
                                     "another for the same member (a tar writer writes one): "
                                     "a damaged or hostile archive")
                pending[key] = (offset, self._extended(kind, size, offset))
                continue
            self._members += 1
            if self._members > self.max_members:
                raise BadArchive(f"it has more than {self.max_members} members, counting "
                                 "every header (files, directories, `./`, headers of any "
                                 f"kind): {raise_key('max_release_files')}")
            if kind == _GLOBAL:
                for _ in _pax_records(self._extended(kind, size, offset), self._damaged, offset):
                    pass  # checked, not used
                continue
            first = min([offset, *(at for at, _ in pending.values())])
            member = self._member(name, kind, mode, size, linkname, first, pending)
            pending = {}
            self._left = 0 if member.kind in _NO_DATA else member.size
            self._count(self._left)
            self._padding = -self._left % BLOCK
            yield member

    def data(self) -> Iterator[bytes]:
        """The data of the last member yielded, CHUNK bytes at most at a time."""
        while self._left:
            chunk = self._read(min(self._left, CHUNK))
            self._left -= len(chunk)
            yield chunk

    def _pass_over(self) -> None:
        for _ in self.data():
            pass
        self._read(self._padding)
        self._padding = 0

    def _extended(self, kind: bytes, size: int, offset: int) -> bytes:
        """The data of the extended header at `offset`, read only when within the bounds."""
        what = _EXTENDED.get(kind, "global pax")
        if size > EXTENDED_MAX:
            raise BadArchive(f"its {what} header at byte {offset} declares {size} bytes (more "
                             f"than {EXTENDED_MAX >> 10} KiB: no name needs that many): a "
                             "damaged or hostile archive")
        self._count(size)
        data = self._read(size)
        self._read(-size % BLOCK)
        return data

    def _count(self, size: int) -> None:
        """Count `size` bytes of data or extended header, before they are read."""
        if self.counted + size > self.max_bytes:
            raise BadArchive(f"its files and extended headers hold more than "
                             f"{size_text(self.max_bytes)} ({raise_key('max_release_bytes')})")
        self.counted += size

    def _member(self, name: str, kind: bytes, mode: int, size: int, linkname: str, offset: int,
                pending: dict[bytes, tuple[int, bytes]]) -> Member:
        """The member of this header, with what its extended headers say (the first read wins)."""
        if kind in (b"\0", b"7"):
            kind = DIRECTORY if kind == b"\0" and name.endswith("/") else FILE
        for key, (at, data) in reversed(pending.items()):
            if key == b"L":
                name = _text(data.split(b"\0", 1)[0])
                continue
            if key == b"K":
                linkname = _text(data.split(b"\0", 1)[0])
                continue
            for keyword, value in _pax_records(data, self._damaged, at):
                if keyword == b"path":
                    name = _text(value)
                elif keyword == b"linkpath":
                    linkname = _text(value)
                elif keyword == b"size":
                    if not value.isdigit():
                        raise self._damaged(f"its pax header at byte {at} gives the size "
                                            f"{value!r}", at)
                    size = int(value)
                elif keyword.startswith(b"GNU.sparse."):
                    kind = SPARSE
        return Member(name, kind, mode, size, linkname, offset)

    def _read(self, size: int, *, at_header: bool = False) -> bytes:
        """`size` bytes of the stream; a header may also find its end (b"")."""
        offset = self.position
        try:
            data = self._src.read(size)
        except _CORRUPT as exc:
            raise self._damaged(" ".join(str(exc).split()) or type(exc).__name__, offset) \
                from None
        except OSError as exc:
            if exc.errno is not None:
                raise BadArchive(f"it cannot be read: {exc.strerror}") from None
            raise self._damaged(" ".join(str(exc).split()), offset) from None
        self.position += len(data)
        if len(data) != size and not (at_header and not data):
            raise self._damaged(f"it ends within {'a header' if at_header else 'a member'}, "
                                f"at byte {self.position}", offset)
        return data

    def _damaged(self, why: str, offset: int) -> BadArchive:
        if offset == 0:
            return BadArchive(NOT_TAR)
        return BadArchive("it cannot be read to its end as a tar archive (damaged or "
                          f"truncated?): {why}")


def _decompressed(raw: io.BufferedReader) -> io.BufferedIOBase:
    """`raw` read through the decompressor its first bytes name, if any."""
    head = raw.peek(6)[:6]
    if head.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if head.startswith(b"BZh"):
        return bz2.BZ2File(raw)
    if head.startswith(b"\xfd7zXZ\0"):
        if lzma is None:  # pragma: no cover
            raise BadArchive("it is compressed with xz, and this Python reads no xz (no lzma)")
        return lzma.LZMAFile(raw)
    return raw


def _fields(block: bytes, damaged: _Damaged, offset: int) -> tuple[str, bytes, int, int, str]:
    """Name, type flag, mode, size and link name of the header `block` at `offset`."""
    try:
        chksum = _number(block[148:156])
        mode, size = _number(block[100:108]), _number(block[124:136])
    except ValueError as exc:
        raise damaged(f"its header at byte {offset} has {exc}", offset) from None
    unsigned = sum(block) - sum(block[148:156]) + 8 * 0x20
    if chksum not in (unsigned, sum(_SIGNED.unpack(block)) + 8 * 0x20):
        raise damaged(f"its header at byte {offset} has a bad checksum", offset)
    name = _text(block[0:100].split(b"\0", 1)[0])
    if block[257:263] == _POSIX_MAGIC and (prefix := block[345:500].split(b"\0", 1)[0]):
        name = _text(prefix) + "/" + name
    return name, block[156:157], mode, size, _text(block[157:257].split(b"\0", 1)[0])


def _number(field: bytes) -> int:
    """A header's number: octal digits (NUL or space ended), or base-256 (GNU)."""
    if field[0] & 0x80:
        if field[0] != 0x80:
            raise ValueError(f"a negative number {field!r}")
        return int.from_bytes(field[1:], "big")
    digits = field.split(b"\0", 1)[0].strip(b" ")
    if digits.strip(b"01234567"):
        raise ValueError(f"a number that is not octal {field!r}")
    return int(digits or b"0", 8)


def _pax_records(data: bytes, damaged: _Damaged, offset: int) -> Iterator[tuple[bytes, bytes]]:
    """The `LENGTH KEYWORD=VALUE\\n` records of the pax header at `offset`, one at a time."""
    pos = 0
    while pos < len(data) and data[pos]:  # NULs may pad the records
        space = data.find(b" ", pos, pos + 20)
        digits = data[pos:space] if space > pos else b""
        end = pos + int(digits) if digits.isdigit() else pos  # past the space, or refused
        keyword, equals, value = data[space + 1:end - 1].partition(b"=")
        if not digits.isdigit() or end <= space + 1 or end > len(data) \
                or data[end - 1] != 0x0A or not equals or not keyword:
            raise damaged(f"its pax header at byte {offset} has a malformed record at byte "
                          f"{pos} of its data", offset)
        yield keyword, value
        pos = end


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")
