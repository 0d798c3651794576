"""A failing disk under `files`, the one writer: a DiskError of one line naming the path and the
fix, the old file left as it was, and an effect allowed to fail lets the transition go on.

The file systems are real: a 64 KiB tmpfs (full) or one remounted read-only, mounted in a
private mount namespace (`unshare -m`) of a child process, which needs root. The transition's
test fakes the disk at the process boundary instead (os.write answers ENOSPC for the files of
one directory), as the whole node runs in this process.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from agent_fsm import files
from agent_fsm.errors import DiskError, ReleaseError, UnsafePath
from agent_fsm.files import disk_error
from agent_fsm.node.config import CONFIG_ENV
from tests.helpers import World
from tests.hostile import stick, sticking

__all__ = ["sticking"]  # a fixture

REPO = Path(__file__).resolve().parents[1]


@cache
def _can_mount() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    done = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs tmpfs /mnt"],
                          capture_output=True, check=False, timeout=30)
    return done.returncode == 0


def _on_small_fs(fs: Path, script: str) -> subprocess.CompletedProcess[str]:
    """Run the Python `script` (given the mount point as argv[1]) in a child process with a
    64 KiB tmpfs mounted at `fs` in its own mount namespace: gone when the child exits."""
    if not _can_mount():
        pytest.skip("mounting a small tmpfs in a private namespace needs root and unshare(1)")
    fs.mkdir()
    env = {**{k: v for k, v in os.environ.items() if k != CONFIG_ENV}, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=64k tmpfs "$1" && exec "$2" -c "$3" "$1"',
         "sh", str(fs), sys.executable, script],
        capture_output=True, text=True, env=env, check=False, timeout=60)


class TestFullDisk:
    def test_a_full_disk_names_the_path_and_the_fix_and_keeps_the_old_file(
            self, tmp_path: Path) -> None:
        """Writing a file larger than the space left fails as one line on stderr, exit 1,
        naming the file, "No space left on device" and `df -h` of its directory; the old
        content is intact and no temporary file is left."""
        fs = tmp_path / "fs"
        done = _on_small_fs(fs, (
            "import json, sys\n"
            "from pathlib import Path\n"
            "from agent_fsm import files\n"
            "from agent_fsm.cli.exits import guarded\n"
            "target = Path(sys.argv[1]) / 'agent-fsm' / 'state.json'\n"
            "files.atomic_write(target, b'old\\n')\n"
            "code = guarded(lambda: files.atomic_write(target, b'x' * (256 << 10)))\n"
            "print(json.dumps({'old': target.read_text(),"
            " 'left': sorted(p.name for p in target.parent.iterdir())}))\n"
            "sys.exit(code)\n"))
        where = fs / "agent-fsm"
        assert done.returncode == 1, done.stderr
        assert done.stderr == (
            f"agent-fsm: could not write {where}/state.json: No space left on device (the file is "
            f"as it was); free space on the file system of {where} (`df -h {where}`) and run the "
            "command again\n")
        assert json.loads(done.stdout) == {"old": "old\n", "left": ["state.json"]}


class TestReadOnlyFileSystem:
    def test_every_write_raises_disk_error_from_the_os_error(self, tmp_path: Path) -> None:
        """On a file system remounted read-only, writing a file, the upgrade signal, closing the
        gate and switching a pointer each raise DiskError (raised from the EROFS OSError),
        naming the path, "Read-only file system" and how to find the mount; nothing changes."""
        fs = tmp_path / "fs"
        done = _on_small_fs(fs, (
            "import json, subprocess, sys\n"
            "from pathlib import Path\n"
            "from agent_fsm import files\n"
            "from agent_fsm.node.runtime import signal\n"
            "from agent_fsm.node.runtime.gate import Gate\n"
            "fs = Path(sys.argv[1])\n"
            "files.atomic_write(fs / 'file', b'old\\n')\n"
            "gate = Gate(fs / 'run' / 'gate')\n"
            "(fs / 'run').mkdir()\n"
            "gate.open()\n"
            "files.atomic_symlink(fs / 'selected', 'releases/1.0.0')\n"
            "subprocess.run(['mount', '-o', 'remount,ro', str(fs)], check=True)\n"
            "up = signal.UpgradeSignal('1.0.0', '2.0.0', 0, 1.0, 2.0)\n"
            "out = {}\n"
            "for name, call in [('file', lambda: files.atomic_write(fs / 'file', b'new\\n')),\n"
            "                   ('signal', lambda: signal.write(fs / 'upgrade-signal.json', up)),\n"
            "                   ('gate', gate.close),\n"
            "                   ('pointer', lambda: files.atomic_symlink(fs / 'selected',"
            " 'releases/2.0.0'))]:\n"
            "    try:\n"
            "        call()\n"
            "        out[name] = None\n"
            "    except Exception as exc:\n"
            "        c = exc.__cause__\n"
            "        out[name] = [type(exc).__name__, str(exc),"
            " c.errno if isinstance(c, OSError) else None]\n"
            "out['after'] = [(fs / 'file').read_text(), gate.is_open(),"
            " str((fs / 'selected').readlink())]\n"
            "print(json.dumps(out))\n"))
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        fix = (f"Read-only file system{{}}; remount the file system of {fs} read-write "
               f"(`findmnt -T {fs}` names it) and run the command again")
        assert out == {
            "file": ["DiskError", f"could not write {fs}/file: "
                     + fix.format(" (the file is as it was)"), errno.EROFS],
            "signal": ["DiskError", f"could not write {fs}/upgrade-signal.json: "
                       + fix.format(" (the file is as it was)"), errno.EROFS],
            "gate": ["DiskError", f"could not remove {fs}/run/gate: "
                     + fix.format("").replace(f"of {fs} ", f"of {fs}/run ")
                     .replace(f"-T {fs}`", f"-T {fs}/run`"), errno.EROFS],
            "pointer": ["DiskError", f"could not point {fs}/selected at releases/2.0.0: "
                        + fix.format(" (the link is as it was)"), errno.EROFS],
            "after": ["old\n", True, "releases/1.0.0"],
        }


    def test_a_command_on_a_read_only_state_dir_is_one_line_and_exit_1(
            self, tmp_path: Path) -> None:
        """`agent-fsm hold` with the state directory on a read-only file system prints one
        line naming the writers' lock and how to find the mount, and exits 1."""
        fs = tmp_path / "fs"
        done = _on_small_fs(fs, (
            "import json, subprocess, sys\n"
            "cli = [sys.executable, '-m', 'agent_fsm', '--root', sys.argv[1] + '/root']\n"
            "subprocess.run([*cli, 'hold', '--reason', 'x'], check=True, capture_output=True)\n"
            "subprocess.run([*cli, 'unhold'], check=True, capture_output=True)\n"
            "subprocess.run(['mount', '-o', 'remount,ro', sys.argv[1]], check=True)\n"
            "done = subprocess.run([*cli, 'hold', '--reason', 'x'], capture_output=True,"
            " text=True)\n"
            "print(json.dumps([done.returncode, done.stderr]))\n"))
        assert done.returncode == 0, done.stderr
        state = fs / "root" / "var" / "lib" / "agent-fsm"
        assert json.loads(done.stdout) == [1, (
            f"agent-fsm: could not open the writers' lock {state}/state.lock: Read-only file "
            f"system; remount the file system of {state} read-write (`findmnt -T {state}` names "
            "it) and run the command again\n")]


def _full_disk(monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
    """os.write answers ENOSPC for the files in `directory`, as a full file system would."""
    real: Callable[..., Any] = os.write

    def write(fd: int, data: Any) -> int:
        if Path(os.readlink(f"/proc/self/fd/{fd}")).parent == directory:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return int(real(fd, data))

    monkeypatch.setattr(os, "write", write)


class TestTolerantEffects:
    def test_a_full_disk_in_write_assets_is_logged_and_the_upgrade_completes(
            self, world: World, monkeypatch: pytest.MonkeyPatch,
            caplog: pytest.LogCaptureFixture) -> None:
        """`complete` writes the new release's assets with `on_error = "log"`: on a full unit
        directory the DiskError is logged and kept in the history entry, the old unit files
        stay as they were, and the transition goes on to `converged` with the gate open."""
        world.installed("1.0.0").upgrading("2.0.0")
        world.node.controller.fire("judge_ok")
        before = world.assets_on_disk()
        unit_dir = world.paths.agent_unit.parent
        _full_disk(monkeypatch, unit_dir)
        doc = world.node.controller.fire("complete")
        monkeypatch.undo()
        assert doc.state == "converged"
        assert world.node.gate.is_open()
        assert world.node.releases.last_good() == "2.0.0"
        assert world.assets_on_disk() == before != {
            n: world.rendered("2.0.0")[n] for n in before}
        skipped = world.node.store.history()[-1]["skipped"]
        assert [s["effect"] for s in skipped] == ["write_assets"]
        assert skipped[0]["error"].startswith(
            f"could not write {unit_dir}/agent.service: No space left on device (the file is as "
            f"it was); free space on the file system of {unit_dir}")
        assert f"write_assets failed during complete and was skipped: {skipped[0]['error']}" \
            in caplog.text


class TestAdvice:
    @pytest.mark.parametrize(("err", "advice"), [
        (errno.ENOSPC, "free space on the file system of /var/lib/agent-fsm (`df -h "
                       "/var/lib/agent-fsm`) and run the command again"),
        (errno.EDQUOT, "free space in uid {uid}'s disk quota on the file system of "
                       "/var/lib/agent-fsm (`quota -u {uid}`) and run the command again"),
        (errno.EROFS, "remount the file system of /var/lib/agent-fsm read-write (`findmnt -T "
                      "/var/lib/agent-fsm` names it) and run the command again"),
        (errno.EIO, "the disk under /var/lib/agent-fsm failed: check it (`dmesg`) and repair or "
                    "replace it before you run the command again"),
        (errno.EMFILE, "fix what keeps uid {uid} from writing in /var/lib/agent-fsm (`agent-fsm "
                       "doctor` checks every path) and run the command again"),
    ])
    def test_each_errno_says_what_to_do(self, err: int, advice: str) -> None:
        """A full disk, a used-up quota, a read-only file system and an I/O error each get their
        own fix after the errno's words; any other errno the general one."""
        exc = disk_error(OSError(err, os.strerror(err)), "write /var/lib/agent-fsm/state.json",
                         Path("/var/lib/agent-fsm"))
        assert str(exc) == (f"could not write /var/lib/agent-fsm/state.json: {os.strerror(err)}; "
                            + advice.format(uid=os.geteuid()))


class TestStagingDirectories:
    @pytest.mark.parametrize("umask", [0o000, 0o022, 0o277])
    def test_a_staging_directory_is_exactly_0700_and_unguessable(self, tmp_path: Path,
                                                                 umask: int) -> None:
        """Whatever the umask, a staging directory is 0700 at a new random name each time,
        and is gone when the block ends."""
        was = os.umask(umask)
        try:
            with files.private_dir(tmp_path, ".x.") as one, files.private_dir(tmp_path, ".x.") as two:
                assert one != two and one.name.startswith(".x.") and len(one.name) == 27
                assert {oct(p.stat().st_mode & 0o7777) for p in (one, two)} == {"0o700"}
                (one / "work").write_text("")
        finally:
            os.umask(was)
        assert list(tmp_path.iterdir()) == []

    def test_a_directory_in_a_setgid_parent_gets_exactly_its_mode(self, tmp_path: Path) -> None:
        """A directory made in a setgid directory has the mode asked for, without the bit."""
        os.chmod(tmp_path, 0o2755)
        files.make_dir(tmp_path / "d", 0o755)
        assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o755

    def test_a_link_at_the_name_is_never_followed(self, tmp_path: Path) -> None:
        """A symlink at the name of a new directory is refused, and its target stays empty."""
        (tmp_path / "target").mkdir()
        (tmp_path / "d").symlink_to(tmp_path / "target")
        with pytest.raises(FileExistsError):
            files.make_dir(tmp_path / "d", 0o700)
        assert list((tmp_path / "target").iterdir()) == []

    @pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
    def test_a_parent_others_may_write_is_refused(self, tmp_path: Path, mode: int) -> None:
        """Staging in (or below) a directory group or others may write without the sticky
        bit is refused, naming it; with the sticky bit it is used."""
        loose = tmp_path / "loose"
        (loose / "below").mkdir(parents=True)
        os.chmod(loose, mode)
        for parent in (loose, loose / "below"):
            with pytest.raises(UnsafePath, match=f"^{loose} has mode {mode:04o}: group or "), \
                    files.private_dir(parent):
                pass
        os.chmod(loose, mode | stat.S_ISVTX)
        with files.private_dir(loose / "below") as staging:
            assert staging.parent == loose / "below"

    @pytest.mark.usefixtures("sticking")
    def test_a_failing_removal_after_a_failing_block_names_both(self, tmp_path: Path) -> None:
        """When the work in a staging directory failed and the directory cannot be removed,
        the error names the directory and what failed first."""
        with pytest.raises(DiskError) as caught, files.private_dir(tmp_path) as staging:
            (staging / "stuck").write_text("")
            stick(staging / "stuck")
            raise ReleaseError("the work failed")
        said = str(caught.value)
        assert said.startswith(f"could not remove {staging}: Operation not permitted (at stuck)")
        assert said.endswith("; it was left by a command that failed: the work failed")
        assert isinstance(caught.value.__cause__, ReleaseError)
