"""How far a long `release add` or `release pack` is, on stderr: timestamped lines when piped,
at most one an interval; a bar on a terminal; nothing with --quiet; stdout keeps the result."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.helpers import World
from tests.node.test_release_store import make_release

ROOT = Path(__file__).resolve().parents[2]
STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"
FILES = 300  # and 6 more: release.toml, the launcher, 3 templates, the big one


def _big(where: Path, version: str = "1.0.0") -> Path:
    """A release of FILES small files and one of 8 MiB: many reads, each a progress record."""
    rel = make_release(where, version, marker=version)
    (rel / "payload").mkdir()
    for i in range(FILES):
        (rel / "payload" / f"f{i}").write_text(f"file {i}\n" * 50)
    (rel / "payload" / "big").write_bytes(os.urandom(8 << 20))
    return rel


def _run(world: World, *args: str, every: str = "0") -> subprocess.CompletedProcess[str]:
    """agent-fsm with stdout and stderr piped, a piped line at most every `every` seconds."""
    cfg = world.root.parent / "config.toml"
    cfg.write_text('name = "agent"\n[judgment]\ndeadline_seconds = 60\nsoak_seconds = 5\n')
    env = {k: v for k, v in os.environ.items() if k != "AGENT_FSM_CONFIG"}
    env["AGENT_FSM_PROGRESS_SECONDS"] = every
    return subprocess.run([sys.executable, "-m", "agent_fsm", "--config", str(cfg), "--root",
                           str(world.root), *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120, check=True)


class TestPiped:
    def test_add_of_a_directory_says_how_far_it_is_in_lines_ending_at_all_of_it(
            self, world: World, tmp_path: Path) -> None:
        """Piped, `release add DIR` prints timestamped lines on stderr with the share done, the
        bytes and the files of all there are, the last one all of them; stdout has only the
        result."""
        rel = _big(tmp_path)
        done = _run(world, "release", "add", str(rel))
        assert done.stdout.startswith("release 1.0.0 stored at ") and done.stdout.count("\n") == 1
        lines = done.stderr.splitlines()
        shape = re.compile(rf"{STAMP} adding {re.escape(str(rel))}: (\d+)% [\d.]+ (MiB|KiB|bytes) "
                           rf"of 8\.\d MiB, ([\d,]+) of {FILES + 6} files")
        matched = [shape.fullmatch(line) for line in lines]
        assert len(lines) > 2 and all(matched), lines
        assert lines[-1].endswith(f"100% 8.1 MiB of 8.1 MiB, {FILES + 6} of {FILES + 6} files")
        counts = [int(m.group(3).replace(",", "")) for m in matched if m]
        assert counts == sorted(counts) and counts[0] < FILES

    def test_no_line_before_the_interval_has_passed(self, world: World, tmp_path: Path) -> None:
        """Piped, an add shorter than the interval between lines prints none at all."""
        done = _run(world, "release", "add", str(_big(tmp_path)), every="3600")
        assert done.stderr == ""

    def test_quiet_prints_no_progress(self, world: World, tmp_path: Path) -> None:
        """`release add --quiet` prints no progress, whatever the interval."""
        done = _run(world, "release", "add", "--quiet", str(_big(tmp_path)))
        assert done.stderr == "" and "stored at" in done.stdout

    def test_add_of_an_archive_says_how_much_of_it_is_read_then_how_far_the_copy_is(
            self, world: World, tmp_path: Path) -> None:
        """Piped, `release add ARCHIVE` says how much of the archive is read and how many files
        it unpacked, then how far the copy into the store is, naming the archive."""
        rel = _big(tmp_path)
        archive = tmp_path / "rel.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(rel, arcname="rel")
        lines = _run(world, "release", "add", str(archive)).stderr.splitlines()
        unpacking = [line for line in lines if " unpacking " in line]
        adding = [line for line in lines if " adding " in line]
        assert unpacking and adding and lines == unpacking + adding, lines
        assert re.fullmatch(rf"{STAMP} unpacking {re.escape(str(archive))}: 100% of 8\.\d MiB "
                            rf"read, {FILES + 6} files", unpacking[-1]), unpacking[-1]
        assert adding[-1].endswith(f"of 8.1 MiB, {FILES + 6} of {FILES + 6} files")

    def test_pack_with_a_payload_says_how_far_its_copy_is(self, world: World,
                                                           tmp_path: Path) -> None:
        """Piped, `release pack --payload SRC` says how far the copy of SRC is, and stdout has
        only what was packed."""
        payload = _big(tmp_path) / "payload"
        out = tmp_path / "packed"
        done = _run(world, "release", "pack", "--version", "2.0.0", "--output", str(out),
                    "--payload", str(payload))
        assert done.stdout.startswith("packed release 2.0.0 in ")
        lines = done.stderr.splitlines()
        assert lines and all(f" packing 2.0.0 ({payload}): " in line for line in lines), lines
        assert lines[-1].endswith(f"of 8.1 MiB, {FILES + 1} of {FILES + 1} files")


@pytest.mark.timeout(120)
def test_on_a_terminal_add_shows_a_bar(world: World, tmp_path: Path) -> None:
    """On a terminal, `release add` draws a progress bar with the bytes and files on stderr."""
    rel = _big(tmp_path)
    cfg = world.root.parent / "config.toml"
    cfg.write_text('name = "agent"\n[judgment]\ndeadline_seconds = 60\nsoak_seconds = 5\n')
    env = {k: v for k, v in os.environ.items() if k not in ("AGENT_FSM_CONFIG", "NO_COLOR")}
    env.update(COLUMNS="160", TERM="xterm")
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "agent_fsm", "--config", str(cfg), "--root",
                             str(world.root), "release", "add", str(rel)], stdin=follower,
                            stdout=subprocess.DEVNULL, stderr=follower, env=env, cwd=ROOT)
    os.close(follower)
    seen = b""
    try:
        while True:
            ready, _, _ = select.select([leader], [], [], 60)
            if not ready:
                break
            try:
                chunk = os.read(leader, 1 << 16)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(leader)
        assert proc.wait(timeout=60) == 0
    text = re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", seen).decode(errors="replace")
    assert f"adding {str(rel)[:40]}" in text and "━" in text, text[-2000:]
    assert f"{FILES + 6:,}/{FILES + 6:,} files" in text and "8.1/8.1 MiB" in text, text[-2000:]
