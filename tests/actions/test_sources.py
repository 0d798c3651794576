"""`release add` of a tar archive (`sources.add_source`, which `install --from` calls too): the
fleet module's archive rules applied in-process, each bad member refused in one line naming it,
nothing left in the store (real archives made with tarfile, real files)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from agent_fsm.actions.releases import trust
from agent_fsm.actions.releases.sources import add_source
from agent_fsm.errors import ReleaseError
from agent_fsm.node.store_config import StoreConfig
from tests.actions.test_payload import with_payload
from tests.helpers import World, one_line
from tests.node.test_release_store import CONFIG, leftovers

ROOT = Path(__file__).resolve().parents[2]


def archive_of(release: Path, archive: Path, *, top: str | None = "myagent-1.0.0",
               mode: str = "w") -> Path:
    """`release` as a tar archive: in the single top directory `top`, or at its top (None)."""
    with tarfile.open(archive, mode) as tar:
        if top is None:
            for child in sorted(release.iterdir()):
                tar.add(child, arcname=child.name)
        else:
            tar.add(release, arcname=top)
    return archive


def with_member(release: Path, archive: Path, member: tarfile.TarInfo,
                data: bytes = b"") -> Path:
    """A good archive of `release` (in its top directory) with one more member."""
    archive_of(release, archive)
    with tarfile.open(archive, "a", format=tarfile.PAX_FORMAT) as tar:
        member.size = len(data) if member.isfile() else 0
        tar.addfile(member, io.BytesIO(data) if member.isfile() else None)
    return archive


def info(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.type, member.linkname, member.mode = kind, linkname, 0o644
    return member


def nothing_stored(world: World) -> bool:
    """No release stored, nor anything left of one in the store (its directory may not exist)."""
    releases = world.paths.releases_dir
    return world.node.releases.versions() == [] and (not releases.exists() or leftovers(world) == [])


class TestArchives:
    @pytest.mark.parametrize(("name", "mode", "top"), [
        ("myagent-1.0.0.tar", "w", "myagent-1.0.0"), ("myagent-1.0.0.tar.gz", "w:gz", None),
        ("myagent-1.0.0.tgz", "w:gz", "myagent-1.0.0"), ("myagent-1.0.0.tar.xz", "w:xz", None)])
    def test_an_archive_is_stored_as_its_directory(self, world: World, tmp_path: Path,
                                                   name: str, mode: str, top: str | None) -> None:
        """A .tar, .tar.gz, .tgz (or .tar.xz) holding a release at its top or in one top
        directory is stored with the digest of the release directory itself; its payload's
        executable stays executable; nothing else is left in the store."""
        release = with_payload(tmp_path)
        added = add_source(str(archive_of(release, tmp_path / name, top=top, mode=mode)),
                           world.node)
        assert (added.version, added.already, added.image) == ("1.0.0", False, None)
        assert added.digest == trust.digest(release)
        assert os.access(added.path / "payload" / "bin" / "myagent", os.X_OK)
        assert leftovers(world) == []
        assert add_source(str(tmp_path / name), world.node).already

    @pytest.mark.parametrize(("case", "says"), [
        ("absolute", "member '/etc/cron.d/x' is an absolute path"),
        ("dot-dot", "member 'myagent-1.0.0/../../x' has a `..` component"),
        ("inner dot-dot", "member 'myagent-1.0.0/bin/../x' has a `..` component"),
        ("symlink", "member 'myagent-1.0.0/payload/etc' is a symlink (to '/etc')"),
        ("hard link", "member 'myagent-1.0.0/payload/x' is a hard link"),
        ("device", "member 'myagent-1.0.0/payload/null' is a device"),
        ("FIFO", "member 'myagent-1.0.0/payload/fifo' is a FIFO"),
        ("twice", "member 'myagent-1.0.0/release.toml' is in the archive twice"),
        ("over the limit", "member 'myagent-1.0.0/payload/big' is larger than 1 MiB (the "
                           "store's limit: raise `[store] max_file_bytes`"),
        ("control character", "member 'myagent-1.0.0/payload/a\\x00b' has a name with a control"),
    ])
    def test_a_bad_member_is_refused_naming_it(self, world: World, tmp_path: Path,
                                               case: str, says: str) -> None:
        """An archive with an absolute member, a `..` component, a link, a device, a FIFO, a
        member twice or one over the store's limits is refused in one line naming the member
        and the archive; nothing is left in the store."""
        release = with_payload(tmp_path)
        archive = tmp_path / "bad.tar"
        member = {
            "absolute": info("/etc/cron.d/x"),
            "dot-dot": info("myagent-1.0.0/../../x"),
            "inner dot-dot": info("myagent-1.0.0/bin/../x"),
            "symlink": info("myagent-1.0.0/payload/etc", tarfile.SYMTYPE, "/etc"),
            "hard link": info("myagent-1.0.0/payload/x", tarfile.LNKTYPE, "/etc/shadow"),
            "device": info("myagent-1.0.0/payload/null", tarfile.CHRTYPE),
            "FIFO": info("myagent-1.0.0/payload/fifo", tarfile.FIFOTYPE),
            "twice": info("myagent-1.0.0/release.toml"),
            "over the limit": info("myagent-1.0.0/payload/big"),
            "control character": info("myagent-1.0.0/payload/a\x00b"),
        }[case]
        if case == "control character":  # only a pax header carries a NUL in a name
            member.pax_headers["path"] = member.name
        node = world.node
        if case == "over the limit":
            node = node._replace(config=node.config._replace(
                store=StoreConfig(max_file_bytes=1 << 20)))
        with_member(release, archive, member, b"x" * ((1 << 20) + 1 if case == "over the limit"
                                                      else 3))
        with pytest.raises(ReleaseError) as refused:
            add_source(str(archive), node)
        message = str(refused.value)
        assert "\n" not in message and says in message, message
        assert f"refusing release archive {archive}" in message and "nothing was stored" in message
        assert nothing_stored(world)

    @pytest.mark.parametrize(("case", "says"), [
        ("two top directories", "its top holds 2 directories: a, b"),
        ("no release", "holds no release.toml at its top or in a single top directory"),
        ("empty", "its top holds nothing"),
        ("not a tar", "it is not a tar archive"),
        ("truncated", "it cannot be read to its end as a tar archive"),
    ])
    def test_an_archive_without_one_release_is_refused(self, world: World, tmp_path: Path,
                                                       case: str, says: str) -> None:
        """An archive with two top directories (and no release.toml at its top), none, nothing,
        or that is not a (whole) tar archive is refused in one line; nothing is left in the
        store."""
        release = with_payload(tmp_path)
        archive = tmp_path / "bad.tar.gz"
        if case == "two top directories":
            with tarfile.open(archive, "w:gz") as tar:
                tar.add(release, arcname="a")
                tar.add(release, arcname="b")
        elif case == "no release":
            with tarfile.open(archive, "w:gz") as tar:
                tar.add(release / "payload", arcname="payload")
        elif case == "empty":
            tarfile.open(archive, "w:gz").close()
        elif case == "not a tar":
            archive.write_bytes(b"PK\x03\x04 a zip file\n")
        else:
            data = archive_of(release, tmp_path / "whole.tar.gz", mode="w:gz").read_bytes()
            archive.write_bytes(data[: len(data) // 2])
        with pytest.raises(ReleaseError) as refused:
            add_source(str(archive), world.node)
        message = str(refused.value)
        assert "\n" not in message and says in message, message
        assert nothing_stored(world)

    def test_a_release_refused_inside_an_archive_is_named_by_the_archive(
            self, world: World, tmp_path: Path) -> None:
        """A release the store refuses once unpacked (here: no executable launcher) is named by
        the archive, never by the store's private directory; nothing is left."""
        release = with_payload(tmp_path)
        (release / "bin" / "agent-fsm").chmod(0o644)
        archive = archive_of(release, tmp_path / "r.tgz", mode="w:gz")
        with pytest.raises(ReleaseError) as refused:
            add_source(str(archive), world.node)
        message = str(refused.value)
        assert str(archive) in message and ".adding." not in message, message
        assert nothing_stored(world)


class TestSources:
    def test_missing_or_special_source_is_one_line(self, world: World, tmp_path: Path) -> None:
        """A source that does not exist, or is a FIFO (never opened, so never waited on), is
        refused saying what `release add` takes."""
        with pytest.raises(ReleaseError, match="does not exist; give a release directory"):
            add_source(str(tmp_path / "nope"), world.node)
        os.mkfifo(tmp_path / "fifo")
        with pytest.raises(ReleaseError, match="is neither a directory nor a regular file"):
            add_source(str(tmp_path / "fifo"), world.node)
        assert nothing_stored(world)

    def test_release_add_of_archives_on_the_command_line(self, tmp_path: Path) -> None:
        """`release add FILE.tgz` stores it and says so (exit 0); a bad archive exits 1 with one
        line on stderr naming the member."""
        cfg = tmp_path / "config.toml"
        cfg.write_text(CONFIG)
        release = with_payload(tmp_path)
        good = archive_of(release, tmp_path / "myagent-1.0.0.tgz", mode="w:gz")
        bad = with_member(with_payload(tmp_path / "other", "2.0.0"), tmp_path / "bad.tar",
                          info("myagent-1.0.0/payload/etc", tarfile.SYMTYPE, "/etc"))
        env = {k: v for k, v in os.environ.items() if k != "AGENT_FSM_CONFIG"}

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "agent_fsm", "--config", str(cfg),
                                   "--root", str(tmp_path / "root"), *args], cwd=ROOT, env=env,
                                  text=True, capture_output=True, timeout=120, check=False)

        stored = run("release", "add", str(good))
        assert stored.returncode == 0, stored.stderr
        assert "release 1.0.0 stored at" in stored.stdout
        assert trust.digest(release) in stored.stdout
        refused = run("release", "add", str(bad))
        assert refused.returncode == 1
        assert "member 'myagent-1.0.0/payload/etc' is a symlink" in one_line(refused)


class TestInterrupted:
    def test_an_unpack_killed_midway_is_swept_by_the_next_add(self, world: World,
                                                              tmp_path: Path) -> None:
        """An add killed while it unpacks an archive (no clean-up ran) leaves its private
        directory in the store; the next add removes it, and stores its own release."""
        releases = world.paths.releases_dir
        code = ("import os, sys\nfrom pathlib import Path\n"
                "from agent_fsm.node.releases import store\n"
                "with store.scratch(Path(sys.argv[1])) as holder:\n"
                "    (holder / 'release').mkdir()\n"
                "    (holder / 'release' / 'half').write_bytes(b'x' * 4096)\n"
                "    os._exit(9)\n")
        killed = subprocess.run([sys.executable, "-c", code, str(releases)], cwd=ROOT,
                                timeout=60, check=False)
        assert killed.returncode == 9 and leftovers(world) != []
        release = with_payload(tmp_path)
        add_source(str(archive_of(release, tmp_path / "r.tgz", mode="w:gz")), world.node)
        assert leftovers(world) == [] and world.node.releases.versions() == ["1.0.0"]
