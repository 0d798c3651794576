"""Staging: `release pack` beside its --output, with another local user (uid 65534) planting
names and racing it; every staging directory's removal failing; the modes of every directory a
fresh node's commands make."""

from __future__ import annotations

import ast
import json
import logging
import os
import re
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

from agent_fsm.actions.releases import images
from agent_fsm.actions.releases.packing import add, pack
from agent_fsm.actions.releases.pruning import prune
from agent_fsm.actions.releases.sources import add_archive
from agent_fsm.errors import DiskError, ReleaseError
from agent_fsm.node.config import Config
from agent_fsm.system import sshsig
from agent_fsm.system.podman import Podman
from tests.helpers import World, env_with_stub_systemctl, make_world
from tests.hostile import NOBODY, PYTHON, as_nobody, run_as_nobody, shared, stick, sticking

__all__ = ["shared", "sticking"]  # fixtures

ROOT = Path(__file__).resolve().parents[2]
VERSION = "1.0.0"
NAME = f"agent-fsm-{VERSION}"
OLD_STAGING = f".{NAME}.packing"  # where pack used to stage: a name anyone could predict


def sticky_drop(top: Path) -> Path:
    """A directory like /tmp: root's, world-writable, sticky."""
    drop = top / "drop"
    drop.mkdir(parents=True)
    os.chmod(drop, 0o1777)
    return drop


def tree_of(top: Path) -> dict[str, tuple[int, int, str]]:
    """Every entry below `top` (links not followed): its owner, mode and what it holds."""
    out = {}
    for where, dirs, names in os.walk(top):
        for name in (*dirs, *names):
            path = Path(where, name)
            st = path.lstat()
            held = (os.readlink(path) if stat.S_ISLNK(st.st_mode) else
                    path.read_text(errors="replace") if stat.S_ISREG(st.st_mode) else "")
            out[str(path.relative_to(top))] = (st.st_uid, stat.S_IMODE(st.st_mode), held)
    return out


def assert_roots_alone(release: Path) -> None:
    """Every entry of `release` is root's, a real directory or file, and nobody else may
    write it."""
    st = release.lstat()
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o755
    for rel, (uid, mode, _held) in tree_of(release).items():
        path = release / rel
        assert not path.is_symlink(), rel
        assert uid == 0, f"{rel} is uid {uid}'s"
        assert mode in (0o755, 0o644), f"{rel} has mode {mode:04o}"


PLANT = """
import os, sys
drop, kind = sys.argv[1:]
staging = os.path.join(drop, ".agent-fsm-1.0.0.packing")
mine = os.path.join(drop, "mine") if kind == "link" else staging
os.mkdir(mine, 0o777)
os.chmod(mine, 0o777)
os.symlink(os.path.join(drop, "..", "root-only"), os.path.join(mine, "release.toml"))
os.mkdir(os.path.join(mine, "bin"), 0o777)
with open(os.path.join(mine, "bin", "agent-fsm"), "w") as f:
    f.write("the user's own")
if kind == "link":
    os.symlink(mine, staging)
"""


class TestPlanted:
    @pytest.mark.parametrize("kind", ["link", "directory"])
    def test_what_a_user_plants_beside_output_is_never_used(self, shared: Path,
                                                              kind: str) -> None:
        """A symlink to another user's directory, or that directory itself, planted where pack
        used to stage, gets nothing written into or through it and is left as it was; none
        of its files end up in the release, and a root-only file its links name is intact."""
        drop = sticky_drop(shared)
        root_only = shared / "root-only"
        root_only.write_text("root's own\n")
        os.chmod(root_only, 0o600)
        run_as_nobody(PLANT, str(drop), kind)
        before = tree_of(drop)

        release = pack(VERSION, drop / NAME)

        assert root_only.read_text() == "root's own\n"
        assert (drop / OLD_STAGING).lstat().st_uid == NOBODY
        assert {k: v for k, v in tree_of(drop).items() if not k.startswith(NAME)} == before
        assert_roots_alone(release)
        assert (release / "bin" / "agent-fsm").read_text() != "the user's own"
        planted = [OLD_STAGING, "mine"] if kind == "link" else [OLD_STAGING]
        assert sorted(os.listdir(drop)) == sorted([*planted, NAME])  # and nothing else left

    @pytest.mark.parametrize("kind", ["directory", "link"])
    def test_an_output_name_a_user_planted_is_refused(self, shared: Path, kind: str) -> None:
        """A directory (or a symlink) a user put at the --output name is refused in one line,
        and nothing is written into it or through it."""
        drop = sticky_drop(shared)
        victim = drop / "mine"
        run_as_nobody("import os, sys; os.mkdir(sys.argv[1], 0o777); os.chmod(sys.argv[1], 0o777)"
                      + ("; os.symlink(sys.argv[1], sys.argv[2])" if kind == "link" else
                         "; os.rename(sys.argv[1], sys.argv[2])"),
                      str(victim), str(drop / NAME))
        with pytest.raises(ReleaseError, match=f"^{drop / NAME} already exists; pack into a new"):
            pack(VERSION, drop / NAME)
        assert os.listdir(drop / NAME) == []
        assert sorted(os.listdir(drop)) == ([NAME, "mine"] if kind == "link" else [NAME])
        assert (drop / NAME).lstat().st_uid == NOBODY


class TestOutputDirectory:
    def test_in_a_sticky_world_writable_directory_the_release_is_roots_alone(
            self, shared: Path) -> None:
        """Packed into a directory like /tmp, the release is root's alone: the user can
        neither rename it, nor remove, change or add a file in it."""
        drop = sticky_drop(shared)
        release = pack(VERSION, drop / NAME)
        assert_roots_alone(release)
        launcher = release / "bin" / "agent-fsm"
        tried = run_as_nobody("""
import os, sys
release, launcher = sys.argv[1:]
for what, call in [("rename", lambda: os.rename(release, release + ".moved")),
                   ("remove", lambda: os.unlink(launcher)),
                   ("write", lambda: open(launcher, "a")),
                   ("add", lambda: open(os.path.join(release, "bin", "mine"), "w")),
                   ("chmod", lambda: os.chmod(release, 0o777))]:
    try:
        call()
        print(what, "done")
    except PermissionError:
        print(what, "refused")
""", str(release), str(launcher))
        assert tried.split("\n")[:-1] == [f"{w} refused" for w in
                                          ("rename", "remove", "write", "add", "chmod")]

    def test_whatever_the_umask_nothing_in_the_release_is_writable_by_others(
            self, tmp_path: Path) -> None:
        """Packed with a umask of 0, the release still has the store's modes alone (0755 and
        0644): nothing in it is group- or world-writable."""
        was = os.umask(0)
        try:
            release = pack(VERSION, tmp_path / NAME)
        finally:
            os.umask(was)
        assert_roots_alone(release)

    def test_missing_directories_above_output_are_made(self, tmp_path: Path) -> None:
        """The missing directories of --output's path are made (0755, whatever the umask) and
        the release packed there."""
        was = os.umask(0o077)
        try:
            release = pack(VERSION, tmp_path / "dist" / "x" / NAME)
        finally:
            os.umask(was)
        assert_roots_alone(release)
        assert {stat.S_IMODE(d.stat().st_mode) for d in (tmp_path / "dist", release.parent)} == \
            {0o755}

    @pytest.mark.parametrize(("mode", "owner"), [(0o777, 0), (0o770, 0), (0o755, NOBODY)])
    def test_a_directory_others_may_change_is_refused(self, shared: Path, mode: int,
                                                      owner: int) -> None:
        """An --output in (or below) a directory that group or others may write without the
        sticky bit, or that another user owns, is refused in one line naming it, and nothing
        is made there."""
        loose = shared / "loose"
        loose.mkdir()
        os.chown(loose, owner, owner)
        os.chmod(loose, mode)
        below = loose / "below"
        below.mkdir(mode=0o755)
        for output in (loose / NAME, below / NAME):
            with pytest.raises(ReleaseError) as caught:
                pack(VERSION, output)
            said = str(caught.value)
            assert said.startswith(f"refusing to pack into {output}: {loose} "), said
            assert said.endswith("nothing was packed") and "\n" not in said
        assert os.listdir(loose) == ["below"] and os.listdir(below) == []


RACE = """
import os, sys, time
drop, stop = sys.argv[1:]
staging = os.path.join(drop, ".agent-fsm-1.0.0.packing")  # where pack used to stage
seen, won, i = set(), [], 0
deadline = time.monotonic() + 60
while not os.path.exists(stop) and time.monotonic() < deadline:
    i += 1
    try:  # taking the old staging name whenever it is free, and filling it
        os.mkdir(staging, 0o777)
        os.chmod(staging, 0o777)
    except OSError:
        pass
    try:
        with open(os.path.join(staging, f"mine{i}"), "w"):
            pass
    except OSError:
        pass
    if i % 100:
        continue
    for name in os.listdir(drop):  # and every other name that appears beside --output
        seen.add(name)
        if name == ".agent-fsm-1.0.0.packing" or name.endswith(".moved"):
            continue
        if name.startswith(".agent-fsm-1.0.0.packing."):  # pack is at work: take its output
            try:
                os.mkdir(os.path.join(drop, "agent-fsm-1.0.0"), 0o777)
                won.append(("agent-fsm-1.0.0", "taken"))
                with open(os.path.join(drop, "agent-fsm-1.0.0", "mine"), "w"):
                    pass
            except OSError:
                pass
        entry = os.path.join(drop, name)
        for rel in ("mine", "bin/agent-fsm", "release/mine", "release/bin/agent-fsm"):
            try:
                with open(os.path.join(entry, rel), "w") as f:
                    f.write("#!/bin/sh\\necho the user's own\\n")
                won.append((name, rel))
            except OSError:
                pass
        try:
            os.rename(entry, entry + ".moved")
            os.mkdir(entry, 0o777)
            won.append((name, "renamed"))
        except OSError:
            pass
print(repr((sorted(seen), won)))
"""


class TestRace:
    ROUNDS = 3  # pack as it was lost one round in four

    def test_a_user_racing_the_staging_area_gets_nothing_into_the_release(
            self, shared: Path, tmp_path: Path) -> None:
        """While pack runs, another user taking the old staging name and the --output name, and
        filling and swapping every name it sees beside --output (the staging directory's
        included), gets none of its files into the release, which is root's alone and the same
        as one packed out of its reach."""
        apart = _contents(pack(VERSION, tmp_path / NAME))
        holders = []
        for n in range(self.ROUNDS):
            drop = sticky_drop(shared / str(n))
            stop = shared / str(n) / "stop"
            racer = as_nobody(PYTHON, "-c", RACE, str(drop), str(stop))
            try:
                time.sleep(0.5)  # it is looping before pack starts
                release = pack(VERSION, drop / NAME)
            finally:
                stop.write_text("")
                out, err = racer.communicate(timeout=60)
            assert racer.returncode == 0, err
            seen, won = ast.literal_eval(out)
            assert_roots_alone(release)
            assert _contents(release) == apart
            theirs = [n for n in seen if n != OLD_STAGING and not n.endswith(".moved")]
            assert not [w for w in won if w[0] in theirs], won
            holders += [n for n in theirs if n != NAME]
        assert holders, "the racer never saw pack's staging directory"


def _contents(release: Path) -> dict[str, str]:
    """What each entry holds, compiled files aside (they record their sources' times)."""
    return {k: v[2] for k, v in tree_of(release).items() if not k.endswith(".pyc")}


def _fake(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def _stuck_in(where: str) -> str:
    """Shell lines that put an immutable file in each directory matching the glob `where`."""
    return f'for d in {where}; do touch "$d/stuck"; chattr +i "$d/stuck"; done\n'


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pack(VERSION, tmp_path_factory.mktemp("packed") / NAME)


@pytest.mark.usefixtures("sticking")
class TestRemovalFailures:
    def test_packs_staging_directory(self, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
        """A pack whose staging directory cannot be removed fails naming it, and says how to
        remove it."""
        out = tmp_path / "out"
        out.mkdir()
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        _fake(bin_dir / "ssh-keygen", _stuck_in(f"{out}/.{NAME}.packing.*")
              + 'for a; do m="$a"; done\necho signature > "$m.sig"\n')
        monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
        with pytest.raises(DiskError) as caught:
            pack(VERSION, out / NAME, sign_key=tmp_path / "key")
        said = str(caught.value)
        assert said.startswith(f"could not remove {out}/.{NAME}.packing."), said
        assert "rm -rf" in said

    def test_signings_temporary_directory(self, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
        """A signature whose temporary directory cannot be removed fails naming it."""
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        _fake(bin_dir / "ssh-keygen", 'for a; do m="$a"; done\necho signature > "$m.sig"\n'
              'chattr +i "$m"\n')
        monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        with pytest.raises(DiskError, match=f"^could not remove {tmp_path}/agent-fsm-sign\\."):
            sshsig.sign(tmp_path / "key", "ns", b"message")

    def _probing_node(self, tmp_path: Path) -> World:
        """A node whose `python` (run to probe each release added) leaves an immutable file
        in every staging directory of the store."""
        world = make_world(tmp_path / "root", Config(python=Path("/usr/bin/probe")))
        releases = world.node.paths.releases_dir
        probe = tmp_path / "root" / "usr" / "bin" / "probe"
        probe.parent.mkdir(parents=True, exist_ok=True)
        _fake(probe, _stuck_in(f"{releases}/.adding.*") + 'exec /usr/bin/python3 "$@"\n')
        return world

    def test_adds_staging_directory(self, tmp_path: Path, release: Path) -> None:
        """An add whose staging directory cannot be removed fails naming it."""
        world = self._probing_node(tmp_path)
        with pytest.raises(DiskError, match=f"^could not remove "
                           f"{world.node.paths.releases_dir}/\\.adding\\."):
            add(release, world.node)

    def test_an_archives_unpacking_directory(self, tmp_path: Path, release: Path) -> None:
        """An archive's add whose unpacking directory cannot be removed fails naming it and
        the staging copy's failure before it."""
        world = self._probing_node(tmp_path)
        archive = tmp_path / "release.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(release, arcname=NAME)
        with pytest.raises(DiskError) as caught:
            add_archive(archive, world.node)
        said = str(caught.value)
        holders = set(re.findall(r"/\.adding\.([0-9a-f]+)", said))
        assert said.startswith("could not remove") and len(holders) == 2, said
        assert "it was left by a command that failed: could not remove" in said

    def test_image_packs_build_context(self, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
        """An image pack whose build context cannot be removed fails naming it."""
        podman = _fake(tmp_path / "podman", 'case "$1" in\nimages) ;;\nbuild)\n'
                       'for a; do c="$a"; done\n' + _stuck_in('"$c"') + f'echo {"ab" * 32} ;;\n'
                       'esac\n')
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        with pytest.raises(DiskError, match=f"^could not remove {tmp_path}/agent-fsm-pack\\."):
            images.pack(VERSION, "localhost/agent:1", (), Podman((str(podman),)))

    def test_a_pruned_tree_left_is_said_and_removed_by_the_next_prune(
            self, world: World, release: Path, tmp_path: Path,
            caplog: pytest.LogCaptureFixture) -> None:
        """A pruned release whose tree cannot be removed is still pruned, with a warning
        naming what was left; the next prune removes it."""
        add(release, world.node)
        releases = world.node.paths.releases_dir
        stick(releases / VERSION / "release.toml")
        with caplog.at_level(logging.WARNING, logger="agent_fsm"):
            assert prune(world.node, (VERSION,)).removed == (VERSION,)
        left = releases / f".{VERSION}.pruning"
        assert {r.getMessage() for r in caplog.records} == {  # by prune, then by its tidying
            f"could not remove {left}: Operation not permitted (at release.toml); remove it "
            f"yourself (`rm -rf {left}`; `lsattr` shows an immutable file) and run the command "
            "again if it failed; the next add or prune tries again"}
        subprocess.run(["chattr", "-i", str(left / "release.toml")], check=True, timeout=10)
        prune(world.node)
        assert not left.exists()

    def test_an_abandoned_staging_directory_is_said_and_left(
            self, world: World, release: Path, caplog: pytest.LogCaptureFixture) -> None:
        """An interrupted add's staging directory that cannot be removed does not fail the
        next add, which names it in a warning."""
        releases = world.node.paths.releases_dir
        add(release, world.node)
        left = releases / ".adding.0123abcd"
        left.mkdir(0o700)
        (left / "stuck").write_text("")
        stick(left / "stuck")
        with caplog.at_level(logging.WARNING, logger="agent_fsm"):
            add(release, world.node)
        assert any(r.getMessage().startswith(f"could not remove {left}: ")
                   for r in caplog.records), caplog.text
        assert left.exists()


AUDIT = """
import os, runpy, sys
os.umask(0)
log = open(sys.argv.pop(1), "a")
def hook(event, args):
    if event == "os.mkdir" and not os.path.lexists(args[0]):  # else it makes nothing
        log.write(repr((os.fspath(args[0]), args[1], args[2])) + "\\n")
        log.flush()
sys.addaudithook(hook)
sys.argv[0] = "agent-fsm"
runpy.run_module("agent_fsm", run_name="__main__")
"""


class TestDirectoryModes:
    def test_no_directory_a_fresh_node_makes_is_ever_wider_than_its_final_mode(
            self, tmp_path: Path, release: Path) -> None:
        """With a umask of 0, every directory that a fresh node's first archive add, install
        --from, add and prune make is created with no bit beyond the mode it keeps (the state
        dir 0700 from its first instant), and every one removed again was private (0700) or
        inside one."""
        archive = tmp_path / "release.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(release, arcname=NAME)
        log = tmp_path / "mkdir.log"
        env = {**env_with_stub_systemctl(tmp_path), "PYTHONPATH": str(ROOT)}
        config = tmp_path / "config.toml"
        config.write_text('name = "agent"\n')
        for root, argv in [("a", ("release", "add", str(archive))),
                           ("b", ("install", "--no-start", "--from", str(archive))),
                           ("c", ("release", "add", str(release))),
                           ("c", ("release", "prune", "--keep", "0"))]:
            (tmp_path / root / "usr" / "bin").mkdir(parents=True, exist_ok=True)
            if not (tmp_path / root / "usr" / "bin" / "python3").exists():
                (tmp_path / root / "usr" / "bin" / "python3").symlink_to("/usr/bin/python3")
            done = subprocess.run([sys.executable, "-c", AUDIT, str(log), "--config", str(config),
                                   "--root", str(tmp_path / root), *argv], env=env,
                                  capture_output=True, text=True, timeout=120, check=False)
            assert done.returncode == 0, done.stderr
        made = [ast.literal_eval(line) for line in log.read_text().splitlines()]
        assert any(p == str(tmp_path / "a" / "var/lib/agent-fsm") for p, _m, _fd in made)
        private: list[str] = []
        wider = []
        for path, mode, dir_fd in made:
            assert dir_fd in (None, -1) and os.path.isabs(path), (path, dir_fd)
            inside = any(path.startswith(p + "/") for p in private)
            if mode & 0o077 == 0:
                private.append(path)
            if inside:
                continue
            try:
                final = stat.S_IMODE(os.lstat(path).st_mode)
            except FileNotFoundError:
                final = 0o700  # removed: it must have been private
            if mode & ~final:
                wider.append(f"{path}: made {mode:04o}, kept {final:04o}")
        assert not wider, wider
        assert json.loads(subprocess.run(
            [sys.executable, "-m", "agent_fsm", "--config", str(config), "--root",
             str(tmp_path / "b"), "status", "--json"], env=env, capture_output=True, text=True,
            timeout=60, check=True).stdout)["selected"] == VERSION
