"""The writers' lock: exclusive between any two agent-fsm processes, whichever release each runs
(earlier ones took it through the `filelock` package, some with flock(2) directly), kept
private, never a planted path, never a soft lock."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from pytest_mock import MockerFixture

from agent_fsm.errors import DiskError, Refused, UnsafePath
from agent_fsm.node.state import lock
from tests.helpers import World

HOLD_WITH_FILELOCK = ("import filelock,sys,time; l=filelock.FileLock(sys.argv[1]); l.acquire();"
                      "print('held', flush=True); time.sleep(float(sys.argv[2])); l.release()")
TRY_WITH_FILELOCK = ("import filelock,sys\n"
                     "try:\n filelock.FileLock(sys.argv[1], timeout=0.3).acquire()\n"
                     "except filelock.Timeout:\n print('busy')\nelse:\n print('got it')")


class TestBetweenReleases:
    def test_a_transition_waits_for_a_lock_an_earlier_release_holds(self, world: World) -> None:
        """While an earlier agent-fsm (locking through filelock) holds the writers' lock, a
        transition of this one waits, then runs once the lock is let go."""
        world.installed("1.0.0")
        holder = subprocess.Popen([sys.executable, "-c", HOLD_WITH_FILELOCK,
                                   str(world.paths.lock_file), "0.5"],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            t0 = time.monotonic()
            world.node.controller.fire("settle")
            waited = time.monotonic() - t0
        finally:
            holder.kill()
            holder.wait()
        assert waited > 0.2  # it did wait for the other process
        assert world.node.store.history()[-1]["trigger"] == "settle"

    def test_an_earlier_release_cannot_lock_while_a_transition_holds(self, world: World) -> None:
        """A transition of this agent-fsm holds the lock against an earlier release's filelock:
        that process times out rather than writing at the same time."""
        world.installed("1.0.0")
        with world.node.store.locked():
            out = subprocess.run([sys.executable, "-c", TRY_WITH_FILELOCK,
                                  str(world.paths.lock_file)],
                                 capture_output=True, text=True, timeout=30).stdout
        assert out.strip() == "busy"
        out = subprocess.run([sys.executable, "-c", TRY_WITH_FILELOCK, str(world.paths.lock_file)],
                             capture_output=True, text=True, timeout=30).stdout
        assert out.strip() == "got it"


class TestWithinThisRelease:
    def test_two_holders_never_overlap(self, tmp_path: Path) -> None:
        """Two threads taking the lock on the same file run their blocks one after the other."""
        path = tmp_path / "state.lock"
        inside: list[int] = []
        overlaps: list[int] = []

        def work(n: int) -> None:
            for _ in range(20):
                with lock.held(path, timeout=10):
                    if inside:
                        overlaps.append(n)
                    inside.append(n)
                    time.sleep(0.001)
                    inside.remove(n)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert overlaps == []

    def test_a_writer_that_cannot_get_it_in_time_is_refused_naming_it(self, world: World) -> None:
        """With the lock held elsewhere past the timeout, a transition is refused (exit 3) with
        the lock file's name, and the state is untouched."""
        world.installed("1.0.0")
        before = world.paths.state_file.read_bytes()
        world.node.store.lock_timeout = 0.2
        with lock.held(world.paths.lock_file, timeout=1):
            t0 = time.monotonic()
            with pytest.raises(Refused, match=r"state\.lock.*try again"):
                world.node.controller.fire("settle")
            assert time.monotonic() - t0 < 5
        assert world.paths.state_file.read_bytes() == before


class TestTheFile:
    def test_it_is_private_whatever_the_umask_and_stays(self, tmp_path: Path) -> None:
        """The lock file is made 0600 under umask 0, an existing 0644 one is made 0600, and
        letting the lock go leaves the file in place."""
        path = tmp_path / "state.lock"
        old = os.umask(0)
        try:
            with lock.held(path, timeout=1):
                pass
        finally:
            os.umask(old)
        assert path.stat().st_mode & 0o777 == 0o600
        path.chmod(0o644)
        with lock.held(path, timeout=1):
            pass
        assert path.stat().st_mode & 0o777 == 0o600

    def test_a_symlink_planted_at_it_is_refused(self, tmp_path: Path) -> None:
        """A symlink at the lock's path is refused, and its target is neither created nor
        changed."""
        target = tmp_path / "elsewhere"
        (tmp_path / "state.lock").symlink_to(target)
        with pytest.raises(UnsafePath, match="symlink"), lock.held(tmp_path / "state.lock", 1):
            pass
        assert not target.exists()

    def test_a_directory_at_it_is_refused(self, tmp_path: Path) -> None:
        """Something that is not a regular file at the lock's path is refused with its name."""
        (tmp_path / "state.lock").mkdir()
        with pytest.raises(UnsafePath, match="not a regular file"), lock.held(tmp_path / "state.lock", 1):
            pass

    def test_without_flock_it_fails_rather_than_lock_softly(self, tmp_path: Path,
                                                            mocker: MockerFixture) -> None:
        """Where flock(2) is not implemented, taking the lock fails with that error, named with
        the lock's path: it never falls back to a marker file that another release's flock would
        not see."""
        mocker.patch("fcntl.flock", side_effect=OSError(errno.ENOSYS, "Function not implemented"))
        with pytest.raises(DiskError, match=r"state\.lock: Function not implemented.*flock") as caught, \
                lock.held(tmp_path / "state.lock", 1):
            pass
        assert isinstance(caught.value.__cause__, OSError)
        assert caught.value.__cause__.errno == errno.ENOSYS
        assert (tmp_path / "state.lock").read_bytes() == b""
