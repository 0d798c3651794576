"""`status` and its next action read the units: a failed agent unit, a failed
recovery unit, a recovery retry pending and a state dir that cannot be written each have their
own situation and commands; a systemctl that is missing, refuses or hangs leaves "unit state
unknown" and a status that still answers. systemctl and journalctl are fakes at the process
boundary: scripts the config's `systemctl` prefix names."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_fsm.node.config import Config, Judgment
from agent_fsm.node.state.validate import RESULT
from agent_fsm.system.publish import RecordPublisher
from agent_fsm.testing import FakeClock, FakeSystemd
from agent_fsm.views.doctor.checks import doctor
from agent_fsm.views.doctor.finding import Finding
from agent_fsm.views.status.report import Status, status
from agent_fsm.wiring import open_node
from tests.helpers import World, make_world

AGENT = "agent.service"
RECOVERY = "agent-recovery.service"
ACTIVE = {"ActiveState": "active", "SubState": "running", "Result": "success", "NRestarts": "0",
          "ExecMainStatus": "0"}
INACTIVE = {"ActiveState": "inactive", "SubState": "dead", "Result": "success",
            "NRestarts": "0", "ExecMainStatus": "0"}
FAILED = {"ActiveState": "failed", "SubState": "failed", "Result": "exit-code", "NRestarts": "2",
          "ExecMainStatus": "3"}
LAST_ERROR = "could not write /var/lib/agent-fsm/state.json: [Errno 28] No space left on device"


def _block(unit: str, props: dict[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in {"Id": unit, "LoadState": "loaded", **props}.items())


def fake_systemctl(where: Path, agent: dict[str, str] | None = None,
                   recovery: dict[str, str] | None = None, *, script: str | None = None,
                   journal: str | None = LAST_ERROR) -> Path:
    """`where/bin/systemctl` answering `show` with the two units' properties (or running
    `script`), and a `journalctl` beside it printing `journal`; records its calls."""
    bindir = where / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    shown = _block(AGENT, agent or ACTIVE) + "\n" + _block(RECOVERY, recovery or INACTIVE)
    body = script if script is not None else f"cat <<'EOF'\n{shown}EOF\n"
    systemctl = bindir / "systemctl"
    systemctl.write_text(f'#!/bin/sh\necho "$*" >> {where}/calls\n{body}')
    journalctl = bindir / "journalctl"
    journalctl.write_text("#!/bin/sh\n" + ("" if journal is None else f"echo '{journal}'\n"))
    for p in (systemctl, journalctl):
        p.chmod(0o755)
    return systemctl


def _world(tmp_path: Path, systemctl: Path | str) -> World:
    config = Config(name="agent", systemctl=(str(systemctl),),
                    judgment=Judgment(deadline_seconds=60, soak_seconds=5, max_attempts=3))
    return make_world(tmp_path / "root", config)


def _candidate_past_deadline(w: World) -> None:
    """The issue's node: the candidate judged by no one, its deadline long past."""
    w.installed("1.0.0").upgrading("2.0.0")
    w.clock.advance(600)


class TestBothUnitsFailed:
    def test_the_issue_case_says_the_way_back_stopped(self, tmp_path: Path) -> None:
        """Both units failed while the state file says a candidate is being judged: status
        no longer says "wait for the judgment"; it says both units failed and nothing
        retries, with the last error, and `next` is `recover`."""
        w = _world(tmp_path, fake_systemctl(tmp_path, FAILED, FAILED))
        _candidate_past_deadline(w)
        st = status(w.node)
        assert st.unit_situation == "both_failed"
        assert f"{AGENT} is failed (exit-code, exit status 3, restarted 2 times)" in st.situation
        assert f"{RECOVERY} is failed" in st.situation and "nothing retries" in st.situation
        assert LAST_ERROR in st.situation
        assert "wait for the judgment" not in st.next.summary
        assert st.next.commands[0] == "agent-fsm recover"
        assert f"journalctl -u {RECOVERY} -n 50" in st.next.commands

    def test_in_judged_ok_it_says_start_the_agent_not_recover(self, tmp_path: Path) -> None:
        """Judged ok, where `recover` refuses: the commands start the agent unit again (its
        daemon publishes or gives up), never `recover`."""
        w = _world(tmp_path, fake_systemctl(tmp_path, FAILED, FAILED))
        w.installed("1.0.0").upgrading("2.0.0")
        w.node.controller.fire("judge_ok")
        st = status(w.node)
        assert st.unit_situation == "both_failed"
        assert f"systemctl start {AGENT}" in st.next.commands
        assert not any(c.split()[-1] == "recover" for c in st.next.commands)


class TestOneUnit:
    def test_a_recovery_retry_pending_says_when(self, tmp_path: Path) -> None:
        """The recovery unit in auto-restart: status says systemd retries the rollback and in
        how long (at most its restart delay), and offers `recover` now."""
        since_us = int(time.monotonic() * 1e6) - 2_000_000
        retrying = {**FAILED, "ActiveState": "activating", "SubState": "auto-restart",
                    "RestartUSec": "30s", "StateChangeTimestampMonotonic": str(since_us)}
        w = _world(tmp_path, fake_systemctl(tmp_path, FAILED, retrying))
        _candidate_past_deadline(w)
        st = status(w.node)
        assert st.unit_situation == "recovery_retrying"
        assert f"systemd retries {RECOVERY} in" in st.situation
        assert st.units is not None and st.units.recovery is not None
        left = st.units.recovery.next_try_in_seconds
        assert left is not None and 0 <= left <= 30
        assert st.next.commands[0] == "agent-fsm recover"

    def test_a_failed_recovery_unit_alone(self, tmp_path: Path) -> None:
        """The rollback's unit failed and the agent's did not: status says the rollback did
        not finish and offers `recover` and the recovery unit's journal."""
        w = _world(tmp_path, fake_systemctl(tmp_path, ACTIVE, FAILED))
        w.installed("1.0.0").upgrading("2.0.0")
        w.node.controller.fire("judge_failed", reason="check failed", reason_class="check_failed")
        st = status(w.node)
        assert st.unit_situation == "recovery_failed"
        assert "the rollback did not finish" in st.situation
        assert st.next.commands == ("agent-fsm recover", f"journalctl -u {RECOVERY} -n 50")

    def test_a_failed_agent_unit_with_no_recovery_run(self, tmp_path: Path) -> None:
        """The candidate's unit failed and the recovery unit never ran: roll back now."""
        w = _world(tmp_path, fake_systemctl(tmp_path, FAILED, INACTIVE))
        _candidate_past_deadline(w)
        st = status(w.node)
        assert st.unit_situation == "agent_failed"
        assert "has not rolled back" in st.situation
        assert st.next.commands[0] == "agent-fsm recover"

    def test_a_failed_agent_unit_when_converged(self, tmp_path: Path) -> None:
        """A converged agent whose unit failed: systemd does not start it again; the commands
        do (reset-failed, start)."""
        w = _world(tmp_path, fake_systemctl(tmp_path, FAILED, INACTIVE))
        w.installed("1.0.0")
        st = status(w.node)
        assert st.unit_situation == "agent_failed"
        assert f"systemctl start {AGENT}" in st.next.commands

    def test_a_stale_failed_recovery_unit_when_converged_is_not_advised(
            self, tmp_path: Path) -> None:
        """Converged, with the recovery unit still `failed` from a rollback finished by hand:
        no situation of the units (nothing is rolling back), the unit still shown failed."""
        w = _world(tmp_path, fake_systemctl(tmp_path, ACTIVE, FAILED))
        w.installed("1.0.0")
        st = status(w.node)
        assert st.unit_situation is None and st.situation == "no upgrade is pending"
        assert st.units is not None and st.units.recovery is not None
        assert st.units.recovery.failed

    def test_healthy_units_change_nothing(self, tmp_path: Path) -> None:
        """An active agent and an idle recovery unit: the state's own situation and advice,
        the units shown, the journal not read."""
        w = _world(tmp_path, fake_systemctl(tmp_path))
        w.installed("1.0.0").upgrading("2.0.0")
        st = status(w.node)
        assert st.unit_situation is None
        assert st.situation == "an upgrade to 2.0.0 is being judged"
        assert st.next.summary.startswith("wait for the judgment of 2.0.0")
        data = st.to_json()["units"]
        assert data["agent"]["active"] == "active" and data["recovery"]["active"] == "inactive"
        assert data["error"] is None and data["last_error"] is None
        assert [line.split()[0] for line in (tmp_path / "calls").read_text().splitlines()] == [
            "show"]


class TestUnknown:
    @pytest.mark.parametrize(("how", "words"), [
        ("missing", "could not run"),
        ("refuses", "exited 1: Failed to connect to bus: Access denied"),
        ("hangs", "did not answer within 2s"),
    ], ids=["missing", "refuses", "hangs"])
    def test_status_still_answers(self, tmp_path: Path, how: str, words: str) -> None:
        """systemctl missing, refusing or hanging: status answers, says "unit state unknown"
        with the reason, and advises from the state file alone."""
        systemctl: Path | str = tmp_path / "nowhere" / "systemctl"
        if how == "refuses":
            systemctl = fake_systemctl(tmp_path, script="echo 'Failed to connect to bus: "
                                                        "Access denied' >&2\nexit 1\n")
        elif how == "hangs":
            systemctl = fake_systemctl(tmp_path, script="exec sleep 30\n")
        w = _world(tmp_path, systemctl)
        _candidate_past_deadline(w)
        st = status(w.node)
        assert st.units is not None and st.units.agent is None and words in str(st.units.error)
        assert st.unit_situation is None
        assert st.next.summary.startswith("wait for the judgment of 2.0.0")

    def test_the_human_view_says_unit_state_unknown(self, tmp_path: Path) -> None:
        """The `units` row of `status` reads "unit state unknown: <why>"."""
        w = _world(tmp_path, tmp_path / "nowhere" / "systemctl")
        w.installed("1.0.0")
        text = _rendered(status(w.node))
        assert "unit state unknown: `" in text and "could not run" in text


def _rendered(st: Status) -> str:
    from rich.console import Console

    from agent_fsm.cli import status_view

    console = Console(width=300, color_system=None)
    with console.capture() as captured:
        console.print(status_view.status_view(st, False))
    return captured.get()


class TestWritesFailing:
    @pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                        reason="needs root and unshare(1) for a private read-only mount")
    def test_a_read_only_state_dir_has_its_own_line(self, tmp_path: Path) -> None:
        """The state dir remounted read-only (in a private mount namespace): `status --json`
        says writes fail, names the directory, gives the units' last error, and the commands
        are about the file system."""
        systemctl = fake_systemctl(tmp_path, FAILED, FAILED)
        w = _world(tmp_path, systemctl)
        _candidate_past_deadline(w)
        cfg = tmp_path / "config.toml"
        cfg.write_text(f'name = "agent"\nsystemctl = ["{systemctl}"]\n')
        state = w.paths.state_dir
        script = (f"mount --make-rprivate / && mount --bind {state} {state} && "
                  f"mount -o remount,bind,ro {state} && exec \"$@\"")
        proc = subprocess.run(
            ["unshare", "-m", "sh", "-c", script, "sh", sys.executable, "-m", "agent_fsm",
             "--config", str(cfg), "--root", str(w.root), "status", "--json"],
            capture_output=True, text=True, timeout=60, check=False,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
        assert proc.returncode == 0, proc.stderr
        data = json.loads(proc.stdout)
        assert data["unit_situation"] == "write_failing"
        assert data["units"]["writes_error"] == f"{state} is on a read-only file system"
        assert data["situation"].startswith(f"writes to the state dir fail: {state} is on a "
                                            "read-only file system (last error: ")
        assert data["next"]["commands"][0] == f"df -h {state}"


class TestQueuedResult:
    def test_status_says_the_result_is_queued_and_since_when(self, tmp_path: Path) -> None:
        """After the dead publisher's way out, status says the result is queued and since when
        the publisher was unreachable, and `outbox` counts it."""
        from agent_fsm.agent.publishing import open_gate_after_judgment

        clock = FakeClock()
        config = Config(name="agent", systemctl=(str(fake_systemctl(tmp_path)),),
                        publish_command=("/bin/false",))
        root = tmp_path / "root"
        probe = open_node(config, root, systemd=FakeSystemd(), clock=clock)
        publisher = RecordPublisher(probe.paths.results_dir, ("/bin/false",),
                                    outbox=probe.paths.outbox_dir, document=RESULT)
        systemd = FakeSystemd()
        node = open_node(config, root, systemd=systemd, publisher=publisher, clock=clock)
        w = World(root, node, systemd, None, clock)  # type: ignore[arg-type]  # a real publisher
        node.paths.gate_file.parent.mkdir(parents=True, exist_ok=True)
        w.installed("1.0.0").upgrading("2.0.0")
        node.controller.fire("judge_ok")
        since = node.store.read().since
        open_gate_after_judgment(node.controller, clock, max_tries=200, give_up_after=30,
                                 monotonic=clock.now)
        st = status(node)
        assert st.state == "converged" and st.outbox == {
            "queued": 1, "publisher_unreachable_since": since}
        assert "the result is queued, publisher unreachable since" in st.situation
        assert st.last_result is not None and st.last_result["publisher_unreachable_since"] == since
        assert "publisher unreachable since" in _rendered(st)


class TestDoctor:
    """`doctor` says what the units say, from the same reading as `status` (while
    the way back cannot finish, status and doctor say what fails and what to do)."""

    def _units_now(self, w: World) -> Finding:
        found = [f for f in doctor(w.node) if f.check == "units now"]
        assert len(found) == 1, found
        return found[0]

    def test_both_units_failed_is_a_failure_with_the_way_out(self, tmp_path: Path) -> None:
        """Both units failed on a pending upgrade: doctor fails with the situation and names
        `agent-fsm recover` as the fix (and exits 1 for it, as any failed check)."""
        w = _world(tmp_path, fake_systemctl(tmp_path, FAILED, FAILED))
        _candidate_past_deadline(w)
        finding = self._units_now(w)
        assert finding.level == "fail"
        assert "nothing retries" in finding.detail and LAST_ERROR in finding.detail
        assert "agent-fsm recover" in finding.fix

    def test_a_retry_pending_is_a_warning_saying_when(self, tmp_path: Path) -> None:
        """A rollback systemd is about to retry is a warning, not a failure: it is the way
        back working; the fix says to wait for it."""
        retrying = {**FAILED, "ActiveState": "activating", "SubState": "auto-restart",
                    "RestartUSec": "2s", "StateChangeTimestampMonotonic": "1"}
        w = _world(tmp_path, fake_systemctl(tmp_path, FAILED, retrying))
        _candidate_past_deadline(w)
        finding = self._units_now(w)
        assert finding.level == "warn" and "retries" in finding.detail
        assert "wait for the retry" in finding.fix

    def test_healthy_units_are_ok(self, tmp_path: Path) -> None:
        """Units running as they should: one ok line naming both."""
        w = _world(tmp_path, fake_systemctl(tmp_path, ACTIVE, INACTIVE))
        w.installed("1.0.0")
        finding = self._units_now(w)
        assert finding.level == "ok"
        assert AGENT in finding.detail and RECOVERY in finding.detail

    def test_units_unknown_is_a_warning(self, tmp_path: Path) -> None:
        """A systemctl that cannot answer leaves doctor going, with a warning that says so."""
        w = _world(tmp_path, fake_systemctl(tmp_path, script="exit 1\n"))
        w.installed("1.0.0")
        finding = self._units_now(w)
        assert finding.level == "warn" and "unit state unknown" in finding.detail
