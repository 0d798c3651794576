"""Starting the workload: its account, its environment, its journal stream, and the daemon
starting a real workload process in its directory with its words expanded."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agent_fsm.actions.recover import recover
from agent_fsm.agent.daemon import Daemon, Waker
from agent_fsm.errors import WorkloadError
from agent_fsm.node.config import Config, Judgment, WorkloadConfig
from agent_fsm.node.records import known_bad
from agent_fsm.node.runtime import workload as record
from agent_fsm.node.state.reasons import MAX_REASON
from agent_fsm.system import workload as workload_proc
from agent_fsm.system.environment import child_environment
from agent_fsm.system.notify import Notifier
from agent_fsm.system.stderr_tail import StderrTail
from tests.helpers import make_world


class Recording(Notifier):
    """A notifier that keeps the fields it would send to systemd, in `sent`."""

    def __init__(self) -> None:
        super().__init__("")
        self.sent: list[str] = []

    def send(self, *fields: str) -> bool:
        self.sent.extend(fields)
        return True

class TestEnvironment:
    def test_children_never_get_systemds_notify_variables(
            self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Checks, hooks and the publish command get agent-fsm's environment less
        NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID."""
        for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
            monkeypatch.setenv(name, "1")
        monkeypatch.setenv("KEPT", "yes")
        env = child_environment({"AGENT_FSM_VERSION": "1.0"})
        assert env["KEPT"] == "yes" and env["AGENT_FSM_VERSION"] == "1.0"
        assert not {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"} & set(env)

    def test_the_workload_gets_exactly_the_documented_environment(
            self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The workload's environment is the documented base, the release's variables and the
        host's table on top, and nothing of the daemon's own."""
        monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
        who = workload_proc.Account(65534, 65534, (65534,), "nobody", "/nonexistent", True)
        env = workload_proc.environment(who, {"AGENT_FSM_VERSION": "2.0"},
                                        (("MODE", "prod"), ("LANG", "de_DE.UTF-8")))
        assert env == {"PATH": workload_proc.PATH, "LANG": "de_DE.UTF-8",
                       "HOME": "/nonexistent", "USER": "nobody", "LOGNAME": "nobody",
                       "AGENT_FSM_VERSION": "2.0", "MODE": "prod"}


class TestAccount:
    def test_no_user_configured_is_the_daemons_own(self) -> None:
        """Without [workload] user or group nothing is switched: the daemon's own account."""
        who = workload_proc.account(None, None, "config x")
        assert (who.uid, who.change) == (os.geteuid(), False)

    def test_a_named_user_gets_its_primary_and_supplementary_groups(self) -> None:
        """`nobody` runs with its uid, its primary group and the groups initgroups gives it."""
        who = workload_proc.account("nobody", None, "config x")
        assert (who.uid, who.gid, who.name, who.change) == (65534, 65534, "nobody", True)
        assert who.groups == tuple(sorted(set(os.getgrouplist("nobody", 65534))))

    def test_a_missing_user_is_an_error_that_names_it(self) -> None:
        """A user that does not exist is refused in one line naming it and what to do."""
        with pytest.raises(WorkloadError, match=r"user 'no-such-agent-user' does not exist on "
                                                r"this host; create it"):
            workload_proc.account("no-such-agent-user", None, "config /etc/x.toml")

    def test_a_number_without_an_entry_needs_a_group(self) -> None:
        """A uid with no passwd entry has no primary group: the message asks for `group`."""
        with pytest.raises(WorkloadError, match="set `\\[workload\\] group`"):
            workload_proc.account(4_000_000, None, "config x")
        assert workload_proc.account(4_000_000, 65534, "config x").groups == (65534,)


class TestJournal:
    def test_the_stream_sends_journalds_header_first(self, tmp_path: Path) -> None:
        """The stream to journald starts with the identifier, an empty unit id, priority 6,
        level prefixes on and no forwarding; then the workload's lines follow."""
        path = tmp_path / "stdout"
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(path))
        server.listen(1)
        got: list[bytes] = []

        def serve() -> None:
            conn, _ = server.accept()
            with conn:
                while chunk := conn.recv(4096):
                    got.append(chunk)

        thread = threading.Thread(target=serve)
        thread.start()
        stream = workload_proc.journal_stream("myagent", path)
        assert stream is not None
        stream.sendall(b"hello\n")
        stream.close()
        thread.join(10)
        server.close()
        assert b"".join(got) == b"myagent\n\n6\n1\n0\n0\n0\nhello\n"

    def test_no_journald_is_no_stream(self, tmp_path: Path) -> None:
        """Without journald's socket there is no stream (the workload inherits the output)."""
        assert workload_proc.journal_stream("myagent", tmp_path / "absent") is None


class TestDaemonStartsIt:
    def test_workload_runs_in_its_payload_directory_with_expanded_words(
            self, tmp_path: Path, waker: Waker) -> None:
        """The daemon starts the release's workload in its payload directory, its placeholders
        expanded and the host's environment added, and records it as running."""
        config = Config(name="agent", judgment=Judgment(deadline_seconds=1, soak_seconds=0),
                        workload=WorkloadConfig(environment=(("MODE", "test"),)))
        world = make_world(tmp_path / "root", config)
        release = world.add_release("1.0.0")
        (release / "payload").mkdir()
        out = tmp_path / "facts"
        (release / "release.toml").write_text(
            'version = "1.0.0"\nworkload = ["/bin/sh", "-c", '
            f'"echo $(pwd) $0 $1 $MODE $AGENT_FSM_PAYLOAD_DIR > {out}; exec sleep 30", '
            '"{release_dir}", "v{version}"]\n')
        world.record_digest("1.0.0")
        world.node.controller.fire("install", release="1.0.0")
        daemon = Daemon(world.node, Notifier(""), waker)
        try:
            assert daemon.startup()
            end = time.monotonic() + 10
            # the shell creates the file (`>`) before echo writes its line: wait for the line
            while not (out.exists() and out.read_text().endswith("\n")) \
                    and time.monotonic() < end:
                time.sleep(0.05)
            assert out.read_text().split() == [str(release / "payload"), str(release), "v1.0.0",
                                               "test", str(release / "payload")]
            view = record.view(world.paths, "1.0.0", "root")
            assert view is not None and view["running"] and view["pid"] == daemon.workload.process.pid  # type: ignore[union-attr]
        finally:
            daemon.workload.stop()
        view = record.view(world.paths, "1.0.0", "root")
        assert view is not None and not view["running"]
        assert view["last_exit"]["signal"] == "SIGTERM"

    def test_serving_status_never_says_running_once_the_workload_died(
            self, tmp_path: Path, waker: Waker) -> None:
        """Once the workload exits after convergence the unit's STATUS= says it exited, and the
        daemon exits with its status so that systemd restarts the unit."""
        world = make_world(tmp_path / "root", Config(name="agent"))
        release = world.add_release("1.0.0")
        (release / "release.toml").write_text(
            'version = "1.0.0"\nworkload = ["/bin/sh", "-c", "exit 3"]\n')
        world.record_digest("1.0.0")
        world.node.controller.fire("install", release="1.0.0")
        notifier = Recording()
        sent = notifier.sent
        assert Daemon(world.node, notifier, waker).run() == 3
        statuses = [f for f in sent if f.startswith("STATUS=")]
        assert statuses[-1] == "STATUS=agent 1.0.0: workload exited with status 3; restarting " \
                               "the unit", statuses
        view = record.view(world.paths, "1.0.0", "root")
        assert view is not None and not view["running"]
        assert view["last_exit"]["code"] == 3

    def test_a_missing_user_stops_the_start_and_says_so(self, tmp_path: Path,
                                                        waker: Waker) -> None:
        """A `[workload] user` that does not exist ends the daemon's start (exit 1) with a
        STATUS= naming the user, and no workload runs."""
        config = Config(name="agent", workload=WorkloadConfig(user="no-such-agent-user"))
        world = make_world(tmp_path / "root", config)
        release = world.add_release("1.0.0")
        (release / "release.toml").write_text(
            'version = "1.0.0"\nworkload = ["/bin/sleep", "30"]\n')
        world.record_digest("1.0.0")
        world.node.controller.fire("install", release="1.0.0")
        notifier = Recording()
        sent = notifier.sent
        daemon = Daemon(world.node, notifier, waker)
        assert daemon.run() == 1 and daemon.workload.process is None
        assert any("'no-such-agent-user' does not exist" in f for f in sent if
                   f.startswith("STATUS=failed: ")), sent


# A workload that tries to write what agent-fsm keeps and says how each try ended.
TRIES = r"""
import errno, json, os, subprocess, sys
state, report = sys.argv[1], sys.argv[2]
def attempt(name, f):
    try:
        f()
        return name, "written"
    except OSError as exc:
        return name, errno.errorcode.get(exc.errno, str(exc.errno))
def append(path):
    with open(path, "ab") as f:
        f.write(b"appended by the workload\n")
def remount():
    if subprocess.run(["mount", "-o", "remount,rw", state], capture_output=True).returncode:
        raise PermissionError(errno.EPERM, "mount refused")
out = dict([
    attempt("shipped file, from its cwd", lambda: append("data.log")),
    attempt("state file", lambda: append(os.path.join(state, "state.json"))),
    attempt("new file in the state dir", lambda: append(os.path.join(state, "new"))),
    attempt("remount the state dir rw", remount),
    attempt("through the daemon's root",
            lambda: append(f"/proc/{os.getppid()}/root{os.path.join(state, 'new')}")),
    attempt("writable path", lambda: append(os.path.join(os.path.dirname(report), "mine"))),
])
with open(report, "w") as f:
    json.dump(out, f)
"""


class TestReadOnlyView:
    def _world(self, tmp_path: Path, **workload: object):  # type: ignore[no-untyped-def]
        writable = tmp_path / "writable"
        writable.mkdir(mode=0o777)
        writable.chmod(0o777)
        config = Config(name="agent", workload=WorkloadConfig(writable_paths=(writable,),
                                                              **workload))  # type: ignore[arg-type]
        world = make_world(tmp_path / "root", config)
        release = world.add_release("1.0.0")
        (release / "payload").mkdir()
        (release / "payload" / "data.log").write_bytes(b"shipped\n")
        (release / "payload" / "tries.py").write_text(TRIES)
        report = writable / "report.json"
        (release / "release.toml").write_text(
            f'version = "1.0.0"\nworkload = ["{sys.executable}", "tries.py", '
            f'"{world.paths.state_dir}", "{report}"]\n')
        world.record_digest("1.0.0")
        world.node.controller.fire("install", release="1.0.0")
        return world, release, report

    def _tries(self, world, report: Path, waker: Waker) -> dict[str, str]:  # type: ignore[no-untyped-def]
        daemon = Daemon(world.node, Notifier(""), waker)
        try:
            assert daemon.startup()
            assert daemon.workload.process is not None
            daemon.workload.process.wait(timeout=30)
        finally:
            daemon.workload.stop()
        return json.loads(report.read_text())  # type: ignore[no-any-return]

    @pytest.mark.skipif(os.geteuid() != 0, reason="a root workload needs a root daemon")
    def test_a_root_workload_cannot_write_the_store_or_the_state_dir(
            self, tmp_path: Path, waker: Waker) -> None:
        """A workload running as root, started as the daemon starts it, is refused (EROFS,
        EPERM) every write to its stored release and the state dir, remounting included, and
        writes its writable path; the release is byte for byte what was stored."""
        world, release, report = self._world(tmp_path)
        tries = self._tries(world, report, waker)
        assert tries == {"shipped file, from its cwd": "EROFS", "state file": "EROFS",
                         "new file in the state dir": "EROFS",
                         "remount the state dir rw": "EPERM",
                         "through the daemon's root": "EACCES", "writable path": "written"}
        assert (release / "payload" / "data.log").read_bytes() == b"shipped\n"
        world.node.releases.verify("1.0.0")  # intact: raises otherwise
        # The view was the workload's alone: the daemon still writes its state dir.
        assert str(world.paths.state_dir) not in Path("/proc/self/mountinfo").read_text()
        (world.paths.state_dir / "probe").write_bytes(b"")
        (world.paths.state_dir / "probe").unlink()

    @pytest.mark.skipif(os.geteuid() != 0, reason="dropping a capability needs root")
    @pytest.mark.parametrize(("user", "said"), [
        ("root", "refused: the workload '/bin/true' was not started: as root (uid 0, gid 0) it "
                 "could write agent-fsm's state dir and stored releases, and the kernel refused "
                 "its read-only view of them (unshare(CLONE_NEWNS): Operation not permitted)"),
        ("nobody", "unconfined: the kernel refused the workload's read-only view of agent-fsm's "
                   "directories (unshare(CLONE_NEWNS): Operation not permitted); starting it "
                   "without one, as nobody (uid 65534, gid 65534)")])
    def test_without_cap_sys_admin_only_a_foreign_account_starts(
            self, tmp_path: Path, user: str, said: str) -> None:
        """A daemon the kernel refuses a mount namespace does not start a workload that could
        write the store without it (root), in one line saying what to do; another account's
        starts, and the daemon is told why it has no read-only view."""
        code = ("import sys; from pathlib import Path; from agent_fsm.system import workload as w\n"
                "who = w.account(sys.argv[1], None, 'config x')\n"
                "try:\n"
                "    p = w.start(['/bin/true'], cwd=Path('/'), env={}, who=who, output=None,\n"
                "                read_only=[Path(sys.argv[2])],\n"
                "                unconfined=lambda why: print('unconfined:', why))\n"
                "    print('started', p.wait())\n"
                "except Exception as exc:\n"
                "    print('refused:', exc)\n")
        done = subprocess.run(
            ["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin", "--",
             sys.executable, "-c", code, user, str(tmp_path)],
            capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2])
        lines = done.stdout.splitlines()
        assert lines[0].startswith(said), done
        assert lines[1:] == ([] if user == "root" else ["started 0"]), done


def _crashing_candidate(tmp_path: Path, waker: Waker, script: str) -> dict[str, object]:
    """Judge a candidate whose workload runs `script` (sh) while its check fails, roll it
    back, and return the result `status` shows (the history, the known-bad mark and the
    published result carry its reason too)."""
    config = Config(name="agent", judgment=Judgment(deadline_seconds=10, soak_seconds=0,
                                                    checks=(("false",),)))
    world = make_world(tmp_path / "root", config)
    world.installed("1.0.0")
    release = world.add_release("2.0.0")
    (release / "release.toml").write_text(
        f'version = "2.0.0"\nworkload = ["/bin/sh", "-c", {json.dumps(script)}]\n')
    world.record_digest("2.0.0")
    world.node.controller.fire("begin_upgrade", release="2.0.0")
    assert not Daemon(world.node, Notifier(""), waker).startup()
    recover(world.node)
    world.node.controller.fire("recovered")
    doc = world.node.store.read()
    assert doc.last_result is not None and doc.last_result["reason_class"] == "crashed"
    mark = known_bad.read(world.paths.known_bad_file).marks["2.0.0"]
    assert mark.reason == doc.last_result["reason"]
    judged = [e for e in world.node.store.history(doc) if e["trigger"] == "judge_failed"]
    assert judged[-1]["reason"] == doc.last_result["reason"]
    assert [r.reason for r in world.publisher.recorded] == [doc.last_result["reason"]]
    return doc.last_result


class TestCrashReason:
    def test_the_reason_names_the_exit_status_and_the_last_stderr_line(
            self, tmp_path: Path, waker: Waker) -> None:
        """A candidate whose workload says why on stderr and exits 3 while being judged
        records the status and the line, in the result, the history and the known-bad mark."""
        result = _crashing_candidate(tmp_path, waker,
                                     "echo starting; echo 'cannot start: bad build' >&2; exit 3")
        assert result["reason"] == ('the workload exited with status 3 while being judged; its '
                                    'last lines on stderr: "cannot start: bad build"')

    def test_control_characters_on_stderr_are_shown_escaped(
            self, tmp_path: Path, waker: Waker) -> None:
        """An escape sequence the workload wrote on stderr is recorded visibly, never raw."""
        result = _crashing_candidate(tmp_path, waker, r"printf '\033[2Jgone\n' >&2; kill -9 $$")
        reason = str(result["reason"])
        assert reason.startswith("the workload was killed by SIGKILL while being judged")
        assert reason.endswith('"\\x1b[2Jgone"') and "\x1b" not in reason

    def test_many_long_lines_keep_the_newest_within_the_reasons_bound(
            self, tmp_path: Path, waker: Waker) -> None:
        """Of many long lines the reason keeps the newest ones that fit its 500 characters."""
        script = "for i in 1 2 3 4 5 6 7; do printf \"line $i %0300d\\n\" 0 >&2; done; exit 1"
        reason = str(_crashing_candidate(tmp_path, waker, script)["reason"])
        assert len(reason) <= MAX_REASON and '"line 7 000' in reason
        assert '"line 6 000' in reason and "line 5" not in reason and reason.endswith('0…"')


class TestStderrTail:
    def test_every_line_is_forwarded_and_the_last_ones_kept(self, tmp_path: Path) -> None:
        """The journal gets every line as written; the tail keeps the last five, each cut."""
        journal = (tmp_path / "journal").open("wb")
        read, write = os.pipe()
        child = subprocess.Popen(
            ["/bin/sh", "-c", "for i in 1 2 3 4 5 6 7; do echo \"line $i\" >&2; done; "
                              "printf 'x%.0s' $(seq 300) >&2"], stderr=write)
        os.close(write)
        tail = StderrTail(read, journal.fileno())
        child.wait()
        last = tail.last_lines(wait=10)
        journal.close()
        assert last == ["line 4", "line 5", "line 6", "line 7", "x" * 199 + "…"]
        assert (tmp_path / "journal").read_text() == \
            "".join(f"line {i}\n" for i in range(1, 8)) + "x" * 300 + "\n"

    def test_a_fast_writer_never_stalls_on_a_journal_that_does_not_read(self) -> None:
        """10 MB on stderr while the journal's end takes nothing: the workload finishes at
        once, lines are dropped rather than waited for (a line says how many), and the tail
        stays bounded."""
        read, write = os.pipe()
        stuck_read, stuck_write = os.pipe()  # nobody reads `stuck_read`
        child = subprocess.Popen(
            [sys.executable, "-c", "import sys\nfor i in range(100_000): "
                                   "sys.stderr.write(f'{i} ' + 'y' * 100 + '\\n')"],
            stderr=write)
        os.close(write)
        tail = StderrTail(read, stuck_write)
        drained = bytearray()

        def drain() -> None:  # the journal, reading again once the workload is done
            while chunk := os.read(stuck_read, 1 << 16):
                drained.extend(chunk)

        reader = threading.Thread(target=drain)
        try:
            assert child.wait(timeout=20) == 0
            reader.start()
            last = tail.last_lines(wait=10)
        finally:
            os.close(stuck_write)
            reader.join(10)
            os.close(stuck_read)
        assert tail.dropped > 90_000
        assert f"<4>agent-fsm: {tail.dropped} line(s) of this stderr were dropped".encode() \
            in drained
        assert [line.split()[0] for line in last] == ["99995", "99996", "99997", "99998",
                                                      "99999"]
        assert all(len(line) <= 200 for line in last)
