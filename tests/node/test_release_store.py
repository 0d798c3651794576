"""The release store: a normalized copy, a digest checked before use, and no way in for others."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest

from agent_fsm.actions.releases.packing import add
from agent_fsm.errors import ReleaseError
from agent_fsm.node.assets.render import TEMPLATES
from agent_fsm.node.releases import hashes as release_hashes
from agent_fsm.node.releases import objects as release_objects
from agent_fsm.node.releases import store as release_store
from agent_fsm.node.releases import tree as release_tree
from agent_fsm.node.releases import usage as release_usage
from agent_fsm.node.store_config import StoreConfig
from agent_fsm.wiring import Node
from tests.helpers import World, make_world

ROOT = Path(__file__).resolve().parents[2]
CONFIG = 'name = "agent"\n[judgment]\ndeadline_seconds = 60\nsoak_seconds = 5\n'
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (device nodes, other users)")


def make_release(where: Path, version: str = "1.0.0", marker: str = "") -> Path:
    """A small release directory: release.toml, an executable bin/agent-fsm, the templates."""
    rel = where / f"rel-{version}{marker}"
    (rel / "bin").mkdir(parents=True)
    (rel / "assets").mkdir()
    packaged = resources.files("agent_fsm") / "templates"
    for name in TEMPLATES:
        (rel / "assets" / name).write_text((packaged / name).read_text())
    (rel / "bin" / "agent-fsm").write_text(f"#!/bin/sh\n# {marker}\nexit 0\n")
    (rel / "bin" / "agent-fsm").chmod(0o755)
    (rel / "release.toml").write_text(f'version = "{version}"\n')
    return rel


def stored(world: World, version: str = "1.0.0") -> Path:
    return world.paths.releases_dir / version


def _flip_a_byte_keeping_times(path: Path) -> None:
    """Change one byte of `path`, then put its size, atime and mtime back as they were."""
    before = path.stat()
    data = bytearray(path.read_bytes())
    data[0] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def leftovers(world: World) -> list[str]:
    """What the store holds besides its releases and their records: hidden entries, and objects
    no release links (garbage)."""
    objects = world.paths.releases_dir / release_objects.OBJECTS
    garbage = [f"{objects.name}/{p.name}" for p in objects.glob("*")
               if p.stat().st_nlink == 1] if objects.is_dir() else []
    return sorted(p.name for p in world.paths.releases_dir.iterdir()
                  if p.name.startswith(".") and p.name not in (release_store.DIGESTS,
                                                               release_hashes.HASHED,
                                                               release_objects.OBJECTS,
                                                               release_usage.USAGE)) + garbage


def cli(root: Path, cfg: Path, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "AGENT_FSM_CONFIG"}
    return subprocess.Popen([sys.executable, "-m", "agent_fsm", "--config", str(cfg), "--root",
                             str(root), *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


class TestNormalized:
    def test_loose_modes_are_stored_0755_or_0644(self, world: World, tmp_path: Path) -> None:
        """setuid, setgid, sticky and 0777 inputs are stored as 0755 (directories, executables)
        or 0644, owned by the uid that stored them."""
        rel = make_release(tmp_path)
        for name, mode in (("suid", 0o4755), ("sgid", 0o2711), ("open", 0o777),
                           ("secret", 0o600), ("plain", 0o664)):
            (rel / "bin" / name).write_text(name)
            (rel / "bin" / name).chmod(mode)
        (rel / "sticky").mkdir()
        (rel / "sticky").chmod(0o1777)
        (rel / "assets").chmod(0o777)
        add(rel, world.node)
        modes = {p.relative_to(stored(world)).as_posix(): stat.S_IMODE(p.lstat().st_mode)
                 for p in stored(world).rglob("*")}
        assert modes["bin/suid"] == modes["bin/sgid"] == modes["bin/open"] == 0o755
        assert modes["bin/secret"] == modes["bin/plain"] == modes["release.toml"] == 0o644
        assert modes["sticky"] == modes["assets"] == modes["bin"] == 0o755
        assert {p.lstat().st_uid for p in stored(world).rglob("*")} == {os.geteuid()}

    def test_a_file_system_that_reads_short_still_gets_each_file_stored_whole(
            self, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Where a read gives fewer bytes than asked (as some network file systems do), each
        file is still read to its end: the stored release holds every byte of the source."""
        rel = make_release(tmp_path)
        (rel / "bin" / "tool").write_bytes(bytes(range(256)) * 40)

        class ShortReads:
            def __getattr__(self, name: str) -> object:
                return getattr(os, name)

            @staticmethod
            def read(fd: int, n: int) -> bytes:
                return os.read(fd, min(n, 7))

        monkeypatch.setattr(release_tree, "os", ShortReads())
        add(rel, world.node)
        monkeypatch.undo()
        for name in ("bin/tool", "assets/agent.service", "release.toml"):
            assert (stored(world) / name).read_bytes() == (rel / name).read_bytes()
        world.reopen().node.releases.reread("1.0.0")

    @pytest.mark.parametrize("kind", ["secret file", "directory", "dangling"])
    def test_a_symlink_is_refused_naming_it(self, world: World, tmp_path: Path, kind: str) -> None:
        """A symlink in a release (to a root-only secret, to a directory, or dangling) is
        refused naming its path; nothing is stored."""
        rel = make_release(tmp_path)
        secret = tmp_path / "secret"
        secret.write_text("root only\n")
        secret.chmod(0o600)
        target = {"secret file": secret, "directory": Path("/etc"),
                  "dangling": tmp_path / "nowhere"}[kind]
        link = rel / "assets" / "agent.service"
        link.unlink()
        link.symlink_to(target)
        with pytest.raises(ReleaseError, match=f"{link} is a symlink"):
            add(rel, world.node)
        assert world.node.releases.versions() == [] and leftovers(world) == []

    def test_launcher_linked_to_another_users_file_is_refused(self, world: World,
                                                              tmp_path: Path) -> None:
        """bin/agent-fsm linked to a file another user owns is refused, so root never runs it."""
        rel = make_release(tmp_path)
        theirs = tmp_path / "theirs.sh"
        theirs.write_text("#!/bin/sh\nexit 0\n")
        (rel / "bin" / "agent-fsm").unlink()
        (rel / "bin" / "agent-fsm").symlink_to(theirs)
        with pytest.raises(ReleaseError, match="bin/agent-fsm is a symlink"):
            add(rel, world.node)

    @pytest.mark.timeout(30)
    def test_a_fifo_is_refused_without_blocking(self, world: World, tmp_path: Path) -> None:
        """A FIFO in a release, even as release.toml, is refused at once, naming it."""
        rel = make_release(tmp_path)
        os.mkfifo(rel / "assets" / "pipe")
        with pytest.raises(ReleaseError, match="assets/pipe is a FIFO"):
            add(rel, world.node)
        (rel / "assets" / "pipe").unlink()
        (rel / "release.toml").unlink()
        os.mkfifo(rel / "release.toml")
        with pytest.raises(ReleaseError, match=r"release\.toml is a FIFO"):
            add(rel, world.node)

    @as_root
    @pytest.mark.timeout(30)
    def test_a_device_is_refused_without_blocking(self, world: World, tmp_path: Path) -> None:
        """A character device (/dev/zero's numbers) in a release is refused at once, naming
        it; so is release.toml linked to /dev/zero."""
        rel = make_release(tmp_path)
        os.mknod(rel / "assets" / "zero", 0o644 | stat.S_IFCHR, os.makedev(1, 5))
        with pytest.raises(ReleaseError, match="assets/zero is a device"):
            add(rel, world.node)
        (rel / "assets" / "zero").unlink()
        (rel / "release.toml").unlink()
        (rel / "release.toml").symlink_to("/dev/zero")
        with pytest.raises(ReleaseError, match=r"release.toml is a symlink \(to /dev/zero\)"):
            add(rel, world.node)
        assert world.node.releases.versions() == [] and leftovers(world) == []

    def test_oversized_inputs_are_refused(self, world: World, tmp_path: Path) -> None:
        """A file over `[store] max_file_bytes` (sparse: refused before it is read), a
        release.toml over 64 KiB, more entries than `max_release_files` and more bytes than
        `max_release_bytes` are each refused, naming the key to raise."""
        rel = make_release(tmp_path)

        def ceiling(**limits: int) -> Node:
            return world.node._replace(config=world.node.config._replace(
                store=StoreConfig(**limits)))

        with open(rel / "big", "wb") as f:
            f.truncate((1 << 20) + 1)
        with pytest.raises(ReleaseError, match=r"big is larger than 1 MiB \(the store's limit: "
                           r"raise `\[store\] max_file_bytes`"):
            add(rel, ceiling(max_file_bytes=1 << 20))
        (rel / "big").unlink()
        (rel / "release.toml").write_text('version = "1.0.0"\n' + "#" * (64 << 10))
        with pytest.raises(ReleaseError, match="larger than 65536 bytes"):
            add(rel, world.node)
        (rel / "release.toml").write_text('version = "1.0.0"\n')
        with pytest.raises(ReleaseError, match=r"more than 5 files and directories \(the "
                           r"store's limit: raise `\[store\] max_release_files`"):
            add(rel, ceiling(max_release_files=5))
        with pytest.raises(ReleaseError, match=r"holds more than 1000 bytes \(the store's "
                           r"limit: raise `\[store\] max_release_bytes`"):
            add(rel, ceiling(max_release_bytes=1000))
        assert world.node.releases.versions() == [] and leftovers(world) == []


TAMPER = {
    "changed bytes": lambda r: (r / "assets" / "agent.service").write_text("[Service]\n"),
    "added file": lambda r: (r / "bin" / "extra").write_text("#!/bin/sh\n"),
    "chmod": lambda r: (r / "bin" / "agent-fsm").chmod(0o4755),
    "chmod of the release": lambda r: r.chmod(0o777),
    "removed file": lambda r: (r / "assets" / "recovery.sh").unlink(),
}


class TestDigest:
    @pytest.mark.parametrize("how", list(TAMPER))
    def test_a_tampered_release_is_neither_selected_nor_rendered(
            self, world: World, tmp_path: Path, how: str) -> None:
        """A stored release changed after it was added is refused at select and at render, with
        one line naming it and the fix."""
        add(make_release(tmp_path), world.node)
        TAMPER[how](stored(world))
        with pytest.raises(ReleaseError, match=r"release 1\.0\.0 is not what was stored: .*"
                           r"release add DIR") as err:
            world.node.controller.fire("install", release="1.0.0")
        assert "\n" not in str(err.value)
        with pytest.raises(ReleaseError, match="not what was stored"):
            world.node.effectors.rendered("1.0.0")
        assert world.node.releases.selected() is None

    def test_the_way_back_refuses_a_tampered_last_good(self, world: World, tmp_path: Path) -> None:
        """A last-good changed after it was added, with no intact copy of the file in the
        store and no other known-good release, is not selected by recover; re-adding it
        replaces the damaged copy and recover then goes back to it."""
        rel = make_release(tmp_path)
        add(rel, world.node)
        world.installed("1.0.0").upgrading("2.0.0")
        TAMPER["changed bytes"](stored(world))
        TAMPER["changed bytes"](world.paths.releases_dir / "2.0.0")  # its only other copy
        with pytest.raises(ReleaseError, match=r"release 1\.0\.0 is not what was stored"):
            world.node.controller.fire("recover")
        again = add(rel, world.node)
        assert again.replaced is not None and "damaged" in again.replaced
        world.node.controller.fire("recover")
        assert world.node.releases.selected() == "1.0.0"

    def test_a_release_checked_before_in_this_process_still_finds_a_change(
            self, world: World, tmp_path: Path) -> None:
        """A process checks a release, knows each file's hash by its stat, and still
        finds a byte changed afterwards even with the size and times put back (a long-lived
        daemon is not fooled by what it hashed before)."""
        add(make_release(tmp_path), world.node)  # its files' hashes are known from here on
        world.node.releases.verify("1.0.0")
        _flip_a_byte_keeping_times(stored(world) / "assets" / "agent.service")
        with pytest.raises(ReleaseError, match=r"release 1\.0\.0 is not what was stored"):
            world.node.releases.verify("1.0.0")

    def test_digest_is_recorded_outside_the_release_and_stable(self, world: World,
                                                               tmp_path: Path) -> None:
        """The digest is the sha256 of the recorded manifest, kept in releases/.digests, and
        the same for the same content wherever it comes from."""
        first = add(make_release(tmp_path / "a"), world.node)
        record = world.paths.releases_dir / ".digests" / "1.0.0"
        text = record.read_bytes()
        assert first.digest == release_store.digest(text) == world.node.releases.verify(
            "1.0.0").digest
        assert text.startswith(b"agent-fsm release manifest v1\nd 0755 - - assets\nf 0644 ")
        assert not (stored(world) / ".digests").exists()
        assert add(make_release(tmp_path / "b"), world.node).digest == first.digest

    def test_a_release_without_its_recorded_digest_is_damaged(self, world: World,
                                                             tmp_path: Path) -> None:
        """A stored release whose digest record is gone is refused when selected, in one line
        saying to add it again; `release list` shows it damaged, and adding the same content
        again replaces it."""
        source = make_release(tmp_path)
        add(source, world.node)
        release_store.record_path(world.paths.releases_dir, "1.0.0").unlink()
        with pytest.raises(ReleaseError, match=r"^release 1\.0\.0 is not what was stored: \S+"
                           r"/\.digests/1\.0\.0 is missing: no digest was recorded for this "
                           r"release; .*Add it again with `agent-fsm release add DIR`[^\n]*$"):
            world.node.controller.fire("install", release="1.0.0")
        assert world.node.releases.selected() is None
        assert world.node.releases.integrity("1.0.0").problem is not None
        again = add(source, world.node)
        assert again.replaced == "its digest record was missing or unreadable"
        world.node.controller.fire("install", release="1.0.0")
        assert world.node.releases.selected() == "1.0.0"

    def test_an_interrupted_replace_is_put_back(self, world: World, tmp_path: Path) -> None:
        """A crash between an add's two renames leaves the old copy hidden; the next add puts
        it back and clears its staging directory."""
        add(make_release(tmp_path), world.node)
        hidden = world.paths.releases_dir / ".1.0.0.replaced.abc"
        stored(world).rename(hidden)
        (world.paths.releases_dir / ".adding.abc").mkdir()
        assert add(make_release(tmp_path / "again"), world.node).already
        assert leftovers(world) == [] and world.node.releases.verify("1.0.0").recorded


class TestHashedRecord:
    def test_a_later_process_checks_a_stored_release_without_reading_it(
            self, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Right after `release add`, another process (a fresh node) checks the release against
        its digest by walking it: it reads no file, since each one's stat is what the store
        recorded with its hash."""
        add(make_release(tmp_path), world.node)
        read: list[str] = []
        real = release_tree.Reader.chunks

        def counted(self: release_tree.Reader, *args: object) -> Iterator[bytes]:
            read.append(str(args[-1]))
            return real(self, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(release_tree.Reader, "chunks", counted)
        world.reopen().node.releases.verify("1.0.0")
        assert read == []
        assert world.reopen().node.releases.integrity("1.0.0").problem is None
        assert read  # `release list` and `doctor` still hash every file

    def test_a_check_keeps_nothing_of_the_release_once_done(self, world: World,
                                                          tmp_path: Path) -> None:
        """A process that checked a release (a daemon, once started) holds no more memory for one
        of 2,000 files than for one of 20: the table of recorded hashes lives only as long as the
        check, or a daemon of a real-size agent would idle at ~450 bytes a file."""
        import gc
        import tracemalloc

        def held_after_check(files: int, version: str) -> int:
            source = make_release(tmp_path, version)
            for i in range(files):
                (source / "assets" / f"f{i:05d}.js").write_text(f"// {i}\n")
            add(source, world.node)
            node = world.reopen().node
            gc.collect()
            tracemalloc.start()
            try:
                before = tracemalloc.get_traced_memory()[0]
                node.releases.verify(version)
                gc.collect()
                return tracemalloc.get_traced_memory()[0] - before
            finally:
                tracemalloc.stop()

        small, big = held_after_check(20, "1.0.0"), held_after_check(2000, "2.0.0")
        assert big - small < 100 * 1024, (small, big)

    def test_a_file_changed_after_it_was_stored_is_refused_with_its_times_put_back(
            self, world: World, tmp_path: Path) -> None:
        """A byte changed in a stored file, its size, mtime and atime put back, is still found
        by the next process: the change moved the file's ctime, which no writer can set."""
        add(make_release(tmp_path), world.node)
        _flip_a_byte_keeping_times(stored(world) / "assets" / "agent.service")
        with pytest.raises(ReleaseError, match=r"release 1\.0\.0 is not what was stored: .*"
                           r"assets/agent\.service changed content"):
            world.reopen().node.releases.verify("1.0.0")

    @pytest.mark.parametrize("record", [b"garbage", b"agent-fsm release hashes v1\n1 2 x\n", None])
    def test_a_damaged_or_missing_record_only_means_hashing(
            self, world: World, tmp_path: Path, record: bytes | None) -> None:
        """A record of hashes that is damaged or gone changes nothing but the time a check
        takes: the release still checks out, and a change in it is still found."""
        add(make_release(tmp_path), world.node)
        path = world.paths.releases_dir / release_hashes.HASHED / "1.0.0"
        if record is None:
            path.unlink()
        else:
            path.write_bytes(record)
        assert world.reopen().node.releases.verify("1.0.0").recorded
        (stored(world) / "bin" / "agent-fsm").write_text("#!/bin/sh\nexit 0\n")
        with pytest.raises(ReleaseError, match="not what was stored"):
            world.reopen().node.releases.verify("1.0.0")

    def test_a_change_that_kept_its_stat_is_refused_before_it_runs_as_a_candidate(
            self, world: World, tmp_path: Path) -> None:
        """A byte changed under a file's recorded stat (what a disk can do; here the record
        is written again with the changed file's stat) passes the walk a start runs, but an
        upgrade to that release is refused before it is selected: every byte is read then."""
        world.add_release("1.0.0")
        world.installed("1.0.0")
        add(make_release(tmp_path, "2.0.0"), world.node)
        damaged = stored(world, "2.0.0") / "assets" / "agent.service"
        _flip_a_byte_keeping_times(damaged)
        releases_dir = world.paths.releases_dir
        kept = {release_tree.key(rel, os.lstat(stored(world, "2.0.0") / rel))
                if rel == "assets/agent.service" else (rel, stamp): entry
                for (rel, stamp), entry in release_hashes.recorded_hashed(releases_dir,
                                                                          "2.0.0").items()}
        release_hashes.record_hashed(releases_dir, "2.0.0", kept)
        assert world.reopen().node.releases.verify("2.0.0").recorded  # the start's walk
        with pytest.raises(ReleaseError, match=r"release 2\.0\.0 is not what was stored: .*"
                           r"assets/agent\.service changed content"):
            world.reopen().node.controller.fire("begin_upgrade", release="2.0.0")
        assert world.reopen().node.releases.selected() == "1.0.0"

    def test_forgetting_a_release_removes_its_record(self, world: World, tmp_path: Path) -> None:
        """When a release leaves the store, its record of hashes goes with its digest."""
        add(make_release(tmp_path), world.node)
        path = world.paths.releases_dir / release_hashes.HASHED / "1.0.0"
        assert path.read_bytes().startswith(release_hashes.HASHED_HEADER)
        release_store.forget(world.paths.releases_dir, "1.0.0")
        assert not path.exists()


class TestCommandLine:
    def test_other_content_exits_3_naming_both_digests(self, tmp_path: Path) -> None:
        """Re-adding a version with other content exits 3 naming both digests; the same
        content says already stored (exit 0); list shows the digest."""
        cfg = tmp_path / "config.toml"
        cfg.write_text(CONFIG)
        root = tmp_path / "root"
        a, b = make_release(tmp_path, marker="a"), make_release(tmp_path, marker="b")
        first = cli(root, cfg, "release", "add", str(a)).communicate()
        assert "stored at" in first[0], first[1]
        proc = cli(root, cfg, "release", "add", str(a))
        out, _ = proc.communicate()
        assert proc.returncode == 0 and "already stored" in out
        proc = cli(root, cfg, "release", "add", str(b))
        _, err = proc.communicate()
        assert proc.returncode == 3 and err.count("sha256:") == 2 and "Traceback" not in err
        listed = json.loads(cli(root, cfg, "release", "list", "--json").communicate()[0])
        assert listed[0]["digest"] in first[0] and listed[0]["intact"] is True

    def test_two_adds_at_once_store_one_whole_release(self, tmp_path: Path) -> None:
        """Two `release add` of one version at once: exactly one stores it, the other says
        already stored (same content) or is refused (other content); never a torn release."""
        cfg = tmp_path / "config.toml"
        cfg.write_text(CONFIG)
        for case, markers in (("same", ("x", "x")), ("other", ("x", "y"))):
            root = tmp_path / case
            dirs = [make_release(tmp_path / case / str(i), marker=m)
                    for i, m in enumerate(markers)]
            for d in dirs:  # big enough that the copies overlap in time
                (d / "payload").write_bytes(os.urandom(8 << 20))
                (d / "payload").chmod(0o644)
            shutil.copyfile(dirs[0] / "payload", dirs[1] / "payload")
            procs = [cli(root, cfg, "release", "add", str(d)) for d in dirs]
            results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
            codes = sorted(code for code, _, _ in results)
            assert codes == ([0, 0] if case == "same" else [0, 3]), results
            assert sum("already stored" in out for _, out, _ in results) == (case == "same")
            world = make_world(root)
            assert world.node.releases.versions() == ["1.0.0"] and leftovers(world) == []
            assert world.node.releases.verify("1.0.0").recorded is not None

    def test_pack_with_an_unclosed_quote_is_a_usage_error(self, tmp_path: Path) -> None:
        """`release pack --workload '"x'` is a usage error (exit 2) with no traceback."""
        proc = cli(tmp_path, tmp_path / "none.toml", "release", "pack", "--version", "1.0.0",
                   "--output", str(tmp_path / "out"), "--workload", '"x')
        _, err = proc.communicate()
        assert proc.returncode == 2 and "Traceback" not in err and "No closing quotation" in err


class TestPrivate:
    def test_state_dir_0700_and_lock_0600_and_old_ones_tightened(self, world: World) -> None:
        """A new state dir is 0700 and its lock 0600; a 0755 dir and a 0644 lock from before
        are tightened by the next writer."""
        world.installed("1.0.0")
        mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
        assert (mode(world.paths.state_dir), mode(world.paths.lock_file)) == (0o700, 0o600)
        world.paths.state_dir.chmod(0o755)
        world.paths.lock_file.chmod(0o644)
        world.node.controller.fire("settle")
        assert (mode(world.paths.state_dir), mode(world.paths.lock_file)) == (0o700, 0o600)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory an unprivileged user can reach: 0755, under /var/tmp (not /root, not /tmp)."""
    path = Path(tempfile.mkdtemp(prefix="agent-fsm-hostile-", dir="/var/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def nobody(script: str) -> subprocess.CompletedProcess[str]:
    """Run a shell script as uid 65534. Through `sh -c`: setpriv resolves the path of the
    command it execs while it still holds root's capabilities, so a command it runs directly
    is reached even through a 0700 directory."""
    return subprocess.run([*NOBODY, "/bin/sh", "-c", script], capture_output=True, text=True,
                          timeout=30, check=False)


@as_root
@pytest.mark.skipif(shutil.which("setpriv") is None or shutil.which("flock") is None,
                    reason="needs setpriv and flock (util-linux)")
class TestHostileUser:
    def test_nobody_cannot_write_lock_or_gain_root_through_the_store(self, shared_dir: Path) -> None:
        """As uid 65534: no write into the store, no `flock -s` on state.lock (permission
        denied), and no euid 0 from a release's setuid-root binary; even with the state dir
        opened up to 0755, the lock and the stored files still refuse."""
        rel = make_release(shared_dir)
        shutil.copy("/usr/bin/id", rel / "bin" / "id")
        (rel / "bin" / "id").chmod(0o4755)
        if nobody(f"{rel}/bin/id -u").stdout.strip() != "0":
            pytest.skip("setuid is not honoured here, so there is nothing to show")
        world = make_world(shared_dir / "root")
        add(rel, world.node)
        world.installed("1.0.0")
        state, release = world.paths.state_dir, stored(world)
        for opened in (False, True):
            state.chmod(0o755 if opened else 0o700)
            wrote = nobody(f"echo x > {release}/assets/agent.service")
            made = nobody(f"touch {release}/bin/new")
            lock = nobody(f"flock -s -n {world.paths.lock_file} true")
            ran = nobody(f"{release}/bin/id -u")
            assert wrote.returncode and "Permission denied" in wrote.stderr
            assert made.returncode and "Permission denied" in made.stderr
            assert lock.returncode and "Permission denied" in lock.stderr
            if opened:
                assert ran.returncode == 0 and ran.stdout.strip() == "65534"
            else:
                assert ran.returncode and "Permission denied" in ran.stderr
        state.chmod(0o700)
        assert world.node.releases.verify("1.0.0").recorded is not None
