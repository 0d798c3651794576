"""The one command runner: what a command gets (input, environment, directory, signals) and
what comes back (output, exit, a timeout, a program that is not there)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from pytest_mock import MockerFixture

from agent_fsm.system import proc


class TestRun:
    def test_input_larger_than_a_pipe_reaches_it_while_its_output_is_read(self) -> None:
        """A megabyte in and out again: neither side waits for the other."""
        data = "".join(f"line {i}\n" for i in range(120_000))
        done = proc.run(["cat"], timeout=30, stdin=data)
        assert (done.returncode, done.stdout, done.stderr) == (0, data, "")

    def test_a_pipelines_writer_ends_quietly(self) -> None:
        """A command gets SIGPIPE at its default (Python ignores it): `yes | head -n 1` ends
        without `yes` complaining of a broken pipe."""
        done = proc.run(["sh", "-c", "yes | head -n 1"], timeout=30)
        assert (done.returncode, done.stdout, done.stderr) == (0, "y\n", "")

    def test_the_program_is_found_on_the_path_it_is_given(self, tmp_path: Path) -> None:
        """A bare name is looked up on `env`'s PATH; it runs in `cwd` with that variable."""
        (tmp_path / "hello").write_text('#!/bin/sh\necho "hello from $(pwd) $GREETING"\n')
        (tmp_path / "hello").chmod(0o755)
        done = proc.run(["hello"], timeout=30, cwd="/",
                        env={"PATH": f"{tmp_path}:{os.environ['PATH']}", "GREETING": "hi"})
        assert done.stdout == "hello from / hi\n"
        assert os.getcwd() != "/"  # ours is left as it was

    def test_a_missing_program_is_named(self) -> None:
        """A program that is not there: CouldNotRun, its reason naming it."""
        with pytest.raises(proc.CouldNotRun) as caught:
            proc.run(["no-such-program-here"], timeout=30)
        assert caught.value.reason == ("[Errno 2] No such file or directory: "
                                       "'no-such-program-here'")

    def test_a_timeout_kills_the_whole_group(self, tmp_path: Path) -> None:
        """`group`: at the timeout the command and its children are killed, and it is a
        CouldNotRun that says so."""
        pidfile = tmp_path / "child"
        with pytest.raises(proc.CouldNotRun, match=r"did not finish within 0\.5s \(killed\)"):
            proc.run(["sh", "-c", f"sleep 30 & echo $! > {pidfile}; wait"], timeout=0.5,
                     group=True)
        child = Path(f"/proc/{int(pidfile.read_text())}/stat")
        for _ in range(100):  # killed: gone, or a zombie until its new parent reaps it
            if not child.exists() or child.read_text().rpartition(")")[2].split()[0] == "Z":
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the command's child outlived the timeout")

    def test_an_interrupted_wait_ends_the_command(self, mocker: MockerFixture) -> None:
        """Interrupted while waiting (Ctrl-C), the runner kills and reaps the command before
        the interruption goes on: it does not run on unseen."""
        spawned = mocker.spy(proc.os, "posix_spawn")
        mocker.patch.object(proc.select, "select", side_effect=KeyboardInterrupt)
        with pytest.raises(KeyboardInterrupt):
            proc.run(["sleep", "30"], timeout=60)
        assert not Path(f"/proc/{spawned.spy_return}").exists()
