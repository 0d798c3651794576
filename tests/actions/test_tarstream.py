"""Release archives are read within bounds set by what is read (`tarstream`, which
`release add FILE.tar…` and `install --from` read through): a hostile header is refused in one
line before it costs memory or time, and what real tar writers make is stored as its directory."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_fsm.actions.releases import tarstream, trust
from agent_fsm.actions.releases.sources import add_source, unpack
from agent_fsm.errors import BadArchive, ReleaseError
from agent_fsm.node.store_config import StoreConfig
from tests.actions import hostile_tars as h
from tests.actions.test_payload import with_payload
from tests.actions.test_sources import nothing_stored
from tests.helpers import World
from tests.node.test_release_store import CONFIG

ROOT = Path(__file__).resolve().parents[2]
RSS_BOUND = 150 << 20  # `release add` of a small archive; a bomb cost 200 MB to 2.6 GB


# Runs a command and prints the peak RSS (KiB) of it and its children: measured from a small
# process, since a child's count starts from its parent's at fork.
_PEAK = ("import resource, subprocess, sys\n"
         "done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, timeout=120)\n"
         "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
         "sys.exit(done.returncode)\n")


def release_add(tmp_path: Path, archive: Path, config: str = "") -> tuple[int, str, int, int]:
    """`agent-fsm release add ARCHIVE` on a node below tmp_path (`config` added to its config):
    its exit code, the start of its stderr, the lines of its stderr and its peak resident memory
    (bytes)."""
    cfg = tmp_path / "config.toml"
    cfg.write_text(CONFIG + config)
    env = {k: v for k, v in os.environ.items() if k != "AGENT_FSM_CONFIG"}
    with (tmp_path / "stderr").open("w+b") as err:
        done = subprocess.run(
            [sys.executable, "-c", _PEAK, sys.executable, "-m", "agent_fsm", "--config", str(cfg),
             "--root", str(tmp_path / "root"), "release", "add", str(archive)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, timeout=150, check=False)
        err.seek(0)
        head, lines = err.read(4096), 0
        err.seek(0)
        while chunk := err.read(1 << 20):  # a line of a bomb's size is counted, not held
            lines += chunk.count(b"\n")
    return done.returncode, head.decode(errors="replace"), lines, int(done.stdout) * 1024


def left_in_store(tmp_path: Path) -> list[str]:
    releases = tmp_path / "root" / "var" / "lib" / "agent-fsm" / "releases"
    return sorted(p.name for p in releases.iterdir()) if releases.exists() else []


def refused_in_one_line(tmp_path: Path, archive: Path, says: str, config: str = "") -> None:
    """`release add ARCHIVE` exits 1 with one line saying `says`, leaves nothing in the store,
    and stays within RSS_BOUND."""
    code, stderr, lines, rss = release_add(tmp_path, archive, config)
    assert rss < RSS_BOUND, f"peak RSS {rss >> 20} MiB"
    assert "Traceback" not in stderr and lines == 1, stderr
    assert code == 1, stderr
    assert f"refusing release archive {archive}: " in stderr and says in stderr, stderr
    assert len(stderr) < 1000, stderr
    assert left_in_store(tmp_path) == []


class TestHostileArchives:
    @pytest.mark.parametrize("bomb", ["pax", "GNU long-name"])
    def test_a_huge_extended_header_is_refused_before_it_is_read(self, tmp_path: Path,
                                                                 bomb: str) -> None:
        """A pax header declaring 128 MiB (a 130 KB .tar.gz) or a GNU long name of 512 MiB
        (a .tar.xz) is refused in one line, naming the header and its size, before its data is
        read: nothing is left behind and memory stays small."""
        archive = h.pax_bomb(tmp_path / "bomb.tar.gz") if bomb == "pax" else \
            h.longname_bomb(tmp_path / "bomb.tar.xz")
        assert archive.stat().st_size < 200_000
        size = 128 << 20 if bomb == "pax" else 512 << 20
        refused_in_one_line(tmp_path, archive,
                            f"its {bomb} header at byte 0 declares {size} bytes (more than 64 KiB")

    def test_a_flood_of_dot_members_is_refused_at_the_member_limit(self, tmp_path: Path) -> None:
        """500,000 `./` headers in a .tar.xz count as members: refused in one line once the
        member limit (`[store] max_release_files`, and two) is passed, naming the key, before
        the rest is decompressed; memory stays small."""
        archive = h.dot_members(tmp_path / "dots.tar.xz", 500_000)
        refused_in_one_line(tmp_path, archive,
                            "it has more than 10002 members, counting every header (files, "
                            "directories, `./`, headers of any kind): the store's limit: raise "
                            "`[store] max_release_files`",
                            config="[store]\nmax_release_files = 10000\n")

    def test_a_chain_of_pax_headers_is_refused_in_one_line(self, tmp_path: Path) -> None:
        """5,000 pax headers in a row (11 KB) are refused in one line at the second, with no
        traceback."""
        archive = h.pax_chain(tmp_path / "chain.tar.gz", 5000)
        refused_in_one_line(tmp_path, archive, "its pax header at byte 1024 follows another "
                                               "for the same member")

    def test_a_pax_record_cut_before_its_length_ends_is_refused_not_parsed_forever(
            self, tmp_path: Path) -> None:
        """A pax header whose last record is cut short within its length (`9`, no space after
        it: a declared size 5 bytes short) is refused naming that record, not taken as a record
        again and again (it grew a list to gigabytes). Read in a process capped at 1 GiB of
        address space, so a regression fails here instead of taking the machine's memory."""
        records = h.pax_record(b"comment", b"x") + h.pax_record(b"linkpath", b"/etc") + b"9"
        archive = h.write(tmp_path / "cut.tar.xz", [(
            h.member(b"r/", kind=b"5") + h.pax(records) + h.member(b"r/bin/", kind=b"S")
            + h.end(), 1)], "xz")
        done = subprocess.run([sys.executable, "-c", _READ_CAPPED, str(archive)], cwd=ROOT,
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout == ("it cannot be read to its end as a tar archive (damaged or "
                               "truncated?): its pax header at byte 512 has a malformed record "
                               "at byte 30 of its data\n"), done.stdout


# Reads the archive argv[1] with tarstream under a 1 GiB address-space cap and prints the
# refusal, if any.
_READ_CAPPED = (
    "import resource, sys\n"
    "hard = resource.getrlimit(resource.RLIMIT_AS)[1]\n"
    "cap = 1 << 30 if hard == resource.RLIM_INFINITY else min(1 << 30, hard)\n"
    "resource.setrlimit(resource.RLIMIT_AS, (cap, hard))\n"
    "from agent_fsm.actions.releases import tarstream\n"
    "from agent_fsm.errors import BadArchive\n"
    "with open(sys.argv[1], 'rb') as raw, tarstream.Reader(\n"
    "        raw, max_members=20, max_bytes=1 << 20) as tar:\n"
    "    try:\n"
    "        for _ in tar.members():\n"
    "            for _ in tar.data():\n"
    "                pass\n"
    "    except BadArchive as exc:\n"
    "        print(exc)\n")


class TestRealArchives:
    @pytest.mark.parametrize("fmt", ["gnu", "posix", "ustar", "v7"])
    def test_gnu_tar_archives_of_each_format_are_stored_as_their_directory(
            self, world: World, tmp_path: Path, fmt: str) -> None:
        """A release archived by GNU tar in each of its formats (long names as GNU long-name
        headers, pax headers or the ustar prefix; non-ASCII names) is stored with the digest
        of the release directory."""
        release = with_payload(tmp_path)
        deep = release / "payload" / "data"
        if fmt in ("gnu", "posix"):  # any length
            deep = deep / ("d" * 90) / ("é" * 40)
        elif fmt == "ustar":  # a directory of 155 bytes at most in the prefix, then the name
            deep = deep / ("d" * 60) / ("é" * 20)
        deep.mkdir(parents=True, exist_ok=True)
        (deep / ("f" * 60 if fmt != "v7" else "f")).write_bytes(b"data\n" * 3000)
        archive = tmp_path / f"r-{fmt}.tar.gz"
        subprocess.run(["tar", f"--format={fmt}", "-czf", str(archive), "-C", str(release.parent),
                        release.name], check=True, timeout=60)
        added = add_source(str(archive), world.node)
        assert added.digest == trust.digest(release)

    def test_every_member_counts_and_the_archive_top_is_allowed(
            self, world: World, tmp_path: Path) -> None:
        """With the store's limit at exactly a release's entries, its archive with `./` and a
        top directory is stored; one more `./` header is refused, naming the member limit."""
        release = shutil.copytree(with_payload(tmp_path), tmp_path / "top" / "myagent")
        entries = sum(1 for _ in release.rglob("*"))
        node = world.node._replace(config=world.node.config._replace(
            store=StoreConfig(max_release_files=entries)))
        archive = tmp_path / "r.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(release.parent, arcname=".")  # `.`, the top directory, then the release
        assert add_source(str(archive), node).version == "1.0.0"
        with tarfile.open(archive, "a") as tar:
            dot = tarfile.TarInfo("./")
            dot.type = tarfile.DIRTYPE
            tar.addfile(dot)
        with pytest.raises(ReleaseError, match=f"more than {entries + 2} members"):
            add_source(str(archive), node)


class TestMembers:
    @pytest.mark.parametrize(("case", "says"), [
        ("sparse", "member 'r/big' is a sparse file; a release holds regular files"),
        ("pax sparse", "member 'r/big' is a sparse file; a release holds regular files"),
        ("long part", f"member 'r/{'n' * 198}'… (302 characters) has a name longer than 255 "
                      "bytes"),
        ("unknown type", "member 'r/v' is of tar type b'V'; a release holds regular files"),
    ])
    def test_a_member_the_store_cannot_hold_is_refused_naming_it(
            self, world: World, tmp_path: Path, case: str, says: str) -> None:
        """A sparse file (GNU or pax), a name part longer than a file system takes (shown cut
        short) or a member of an unknown tar type is refused in one line naming it."""
        member = {"sparse": h.member(b"r/big", b"x", b"S"),
                  "pax sparse": h.pax(h.pax_record(b"GNU.sparse.map", b"0,1"))
                  + h.member(b"r/big", b"x"),
                  "long part": h.pax(h.pax_record(b"path", b"r/" + b"n" * 300))
                  + h.member(b"r/x", b"x"),
                  "unknown type": h.member(b"r/v", b"", b"V")}[case]
        archive = h.write(tmp_path / "a.tar", [(h.member(b"r/", kind=b"5") + member + h.end(),
                                                1)], "")
        with pytest.raises(ReleaseError) as refused:
            add_source(str(archive), world.node)
        assert "\n" not in str(refused.value) and says in str(refused.value), str(refused.value)
        assert nothing_stored(world)


# What the property test reads within: few members and bytes, so a generated archive passes them.
_MEMBERS, _BYTES = 20, 1 << 20
_FRAMING = 4 * 2 * h.BLOCK  # a member's headers (one of each kind) and paddings, at most
# Held while reading besides the decompressor: an extended header (as bytes, then a name) and a
# chunk or two, whatever the archive's size.
_HELD = 2 * tarstream.EXTENDED_MAX + 4 * tarstream.CHUNK + (128 << 10)
_NAMES = st.one_of(
    st.sampled_from(["./", ".", "r", "r/release.toml", "r/bin/", "../x", "/abs", "r/a\x01"]),
    st.text(alphabet="ab/.é", max_size=12),
    st.integers(90, 400).map(lambda n: "r/" + "n" * n))


@st.composite
def _member(draw: st.DrawFn, *, small: bool = False) -> bytes:
    data = b"x" * draw(st.integers(0, 10 if small else 3000))
    declared = max(0, len(data) + draw(st.sampled_from([0] * 8 + [-700, -1, 1, 513, 1 << 30])))
    name = draw(_NAMES).encode()
    kind = draw(st.sampled_from([b"0", b"0", b"5", b"\0", b"7", b"2", b"1", b"S", b"V", b"3"]))
    prefix = draw(st.sampled_from([b"", b"r/p"]))
    block = h.header(name, kind, declared, prefix=prefix,
                     chksum=draw(st.sampled_from([None] * 7 + [1])))
    return block + data + h.padding(len(data))


@st.composite
def _extended(draw: st.DrawFn, *, small: bool = False) -> bytes:
    kind = draw(st.sampled_from([b"x", b"g", b"X", b"L", b"K"]))
    if kind in (b"L", b"K"):
        data = b"n" * draw(st.sampled_from([1, 300] if small else [1, 300, 70_000, 600_000, 1 << 20])) \
            + b"\0"
    else:
        records = draw(st.lists(st.sampled_from([
            h.pax_record(b"path", b"r/p" * draw(st.sampled_from(
                [1, 50] if small else [1, 50, 30_000, 300_000]))),
            h.pax_record(b"size", draw(st.sampled_from([b"0", b"12", b"99999999999", b"-1"]))),
            h.pax_record(b"linkpath", b"/etc"), h.pax_record(b"GNU.sparse.map", b"0,1"),
            h.pax_record(b"comment", b"x"), b"9 bad\n", b"99999 a=b\n", b"\0\0\0"]), max_size=3))
        data = b"".join(records)
    declared = max(0, len(data) + draw(st.sampled_from([0, 0, -5, 600, 1 << 27])))
    return h.header(b"././@LongLink", kind, declared) + data + h.padding(len(data))


_SMALL = st.one_of(_member(small=True), _extended(small=True))
_PIECES = st.lists(st.one_of(_member(), _member(), _extended(), st.binary(min_size=1, max_size=600),
                             st.tuples(_SMALL, st.integers(2, 400)).map(  # floods and chains
                                 lambda repeat: repeat[0] * repeat[1])), min_size=1, max_size=8)
_CUTS = st.one_of(st.none(), st.none(), st.none(), st.floats(0, 1))  # truncated, or not


class TestBoundedReading:
    @settings(max_examples=300, deadline=None, suppress_health_check=[
        HealthCheck.too_slow, HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture])  # each example works in its own directory
    @given(pieces=_PIECES, ends=st.booleans(), cut=_CUTS,
           compression=st.sampled_from(["", "gz", "xz", "bz2"]))
    def test_any_archive_is_read_within_bounds_or_refused_in_one_line(
            self, tmp_path: Path, pieces: list[bytes], ends: bool, cut: float | None,
            compression: str) -> None:
        """Whatever an archive holds (long names, pax records, chains of extended headers, `./`
        floods, sizes that lie, garbage, truncation), reading it holds at most a bounded memory
        whatever its size, reads at most the limits' bytes and a few blocks a member, and it is
        stored or refused in one line, never with a traceback."""
        stream = b"".join(pieces) + (h.end() if ends else b"")
        stream = stream if cut is None else stream[:int(len(stream) * cut)]
        with tempfile.TemporaryDirectory(dir=tmp_path) as work:
            archive = h.write(Path(work) / "a.tar", [(stream, 1)], compression)
            position, counted, peak = _read_all(archive)
            assert peak < _baseline(compression) + _HELD, (peak, _baseline(compression))
            assert counted <= _BYTES  # data and extended headers
            assert position - counted <= (_MEMBERS + 1) * _FRAMING + 2 * h.BLOCK, position
            try:
                unpack(archive, Path(work) / "into",
                       StoreConfig(max_release_files=_MEMBERS - 2, max_release_bytes=_BYTES))
            except ReleaseError as exc:
                assert "\n" not in str(exc) and len(str(exc)) < 1000, str(exc)[:2000]


def _read_all(archive: Path) -> tuple[int, int, int]:
    """Read every member of `archive` and its data: the bytes of the stream read, those of data
    and extended headers, and the peak of the memory allocated meanwhile."""
    tracemalloc.start()
    try:
        with archive.open("rb") as raw, tarstream.Reader(
                raw, max_members=_MEMBERS, max_bytes=_BYTES) as tar:
            try:
                for _ in tar.members():
                    for _ in tar.data():
                        pass
            except BadArchive as exc:
                assert "\n" not in str(exc)
        return tar.position, tar.counted, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@functools.cache
def _baseline(compression: str) -> int:
    """The peak memory of reading an empty archive so compressed (the decompressor's own)."""
    with tempfile.TemporaryDirectory() as work:
        return _read_all(h.write(Path(work) / "empty.tar", [(h.end(), 1)], compression))[2]
