"""Tar archives as a hostile writer makes them, built block by block (tarfile writes none of
these): headers whose declared sizes are huge, chains of extended headers, floods of `./`
members. Each is written as a compressed stream, so a bomb of gigabytes is a small file."""

from __future__ import annotations

import bz2
import gzip
import lzma
from collections.abc import Iterable
from pathlib import Path

BLOCK = 512
_MiB = 1 << 20


def header(name: bytes, kind: bytes = b"0", size: int = 0, *, mode: int = 0o644,
           linkname: bytes = b"", magic: bytes = b"ustar\x0000", prefix: bytes = b"",
           chksum: int | None = None) -> bytes:
    """One 512-byte tar header; its checksum right unless `chksum` is given."""
    block = bytearray(BLOCK)
    block[0:100] = name[:100].ljust(100, b"\0")
    block[100:108] = b"%07o\0" % mode
    block[108:124] = b"0000000\x000000000\0"
    block[124:136] = b"%011o\0" % size if size < 8 ** 11 else \
        b"\x80" + size.to_bytes(11, "big")
    block[136:148] = b"00000000000\0"
    block[148:156] = b" " * 8
    block[156:157] = kind
    block[157:257] = linkname[:100].ljust(100, b"\0")
    block[257:265] = magic
    block[345:500] = prefix[:155].ljust(155, b"\0")
    block[148:156] = b"%06o\0 " % (sum(block) if chksum is None else chksum)
    return bytes(block)


def padding(size: int) -> bytes:
    return b"\0" * (-size % BLOCK)


def pax_record(keyword: bytes, value: bytes) -> bytes:
    """One `LEN KEY=VALUE\\n` record, LEN counting itself."""
    body = b" " + keyword + b"=" + value + b"\n"
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length += 1
    return str(length).encode() + body


def pax(records: bytes, kind: bytes = b"x") -> bytes:
    return header(b"././@PaxHeader", kind, len(records)) + records + padding(len(records))


def member(name: bytes, data: bytes = b"", kind: bytes = b"0") -> bytes:
    return header(name, kind, len(data)) + data + padding(len(data))


def end() -> bytes:
    return b"\0" * (2 * BLOCK)


Parts = Iterable[tuple[bytes, int]]  # bytes, and how many times in a row
_COMPRESS = {"gz": lambda b: gzip.compress(b, 9), "bz2": bz2.compress, "xz": lzma.compress,
             "": lambda b: b}


def repeated(byte: bytes, total: int) -> Parts:
    """`total` bytes of `byte`, in MiB parts."""
    whole, rest = divmod(total, _MiB)
    return [(byte * _MiB, whole), (byte * rest, 1)]


def write(path: Path, parts: Parts, compression: str = "gz") -> Path:
    """The stream `parts` written to `path`, compressed with `compression` ("", gz, bz2, xz):
    each part compressed once and repeated (gzip, bzip2 and xz streams read on one after another),
    so that a stream of gigabytes takes a moment to make."""
    with path.open("wb") as out:
        for data, times in parts:
            packed = _COMPRESS[compression](data)
            for _ in range(times):
                out.write(packed)
    return path


def pax_bomb(path: Path, declared: int = 128 * _MiB) -> Path:
    """A pax header declaring `declared` bytes: one `path` record as long as that, then a
    member it would name."""
    keyword = b" path="
    digits = len(str(declared))
    value = declared - digits - len(keyword) - 1

    return write(path, [(header(b"././@PaxHeader", b"x", declared) + str(declared).encode()
                         + keyword, 1), *repeated(b"a", value),
                        (b"\n" + padding(declared) + member(b"release.toml", b'version = "1.0.0"\n')
                         + end(), 1)])


def longname_bomb(path: Path, declared: int = 512 * _MiB) -> Path:
    """A GNU long-name header declaring `declared` bytes of name, then the member it names."""
    return write(path, [(header(b"././@LongLink", b"L", declared, magic=b"ustar  \0"), 1),
                        *repeated(b"a", declared - 1),
                        (b"\0" + padding(declared) + member(b"x", b"x") + end(), 1)], "xz")


def dot_members(path: Path, count: int = 500_000, compression: str = "xz") -> Path:
    """`count` headers of the directory `./`, then the end."""
    dot = header(b"./", b"5", mode=0o755)
    return write(path, [(dot * 1000, count // 1000), (dot * (count % 1000) + end(), 1)],
                 compression)


def pax_chain(path: Path, count: int = 5000) -> Path:
    """`count` pax headers in a row, each for the next, then one member."""
    one = pax(pax_record(b"comment", b"x"))
    return write(path, [(one * count + member(b"release.toml", b'version = "1.0.0"\n') + end(),
                         1)])
