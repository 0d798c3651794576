"""`upgrade --wait` piped: one timestamped line a phase (never one a read), and on a rollback
the result's reason on stderr, as `status` has it."""

from __future__ import annotations

import io
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from agent_fsm.actions.recover import recover
from agent_fsm.actions.upgrade import Phase, Progress, follow
from agent_fsm.cli import fast_path
from agent_fsm.cli.live_line import LiveLine
from agent_fsm.cli.progress import Lines
from agent_fsm.node.check_config import HttpCheck
from agent_fsm.node.runtime import judgment
from agent_fsm.system.clock import SystemClock
from tests.helpers import make_world

T0 = 1_796_290_200.0  # 2026-12-03T09:30:00Z


def _at(after: float, phase: Phase, attempt: int = 0, left: float | None = None,
        state: str = "candidate_running") -> Progress:
    return Progress(T0 + after, after, phase, state, "2.0.0", attempt, 3, left)


class TestLines:
    def test_one_line_a_phase_never_one_a_read(self) -> None:
        """Reads that find the same phase and attempt print nothing more; each change prints
        one line with its time, its seconds since the upgrade began and what it is."""
        said: list[str] = []
        lines = Lines(said.append)
        for p in (_at(0.1, Phase.starting, 0, 60), _at(0.6, Phase.starting, 0, 59.5),
                  _at(1.0, Phase.judging, 1, 60), _at(1.5, Phase.judging, 1, 59.5),
                  _at(9.0, Phase.judging, 2, 60),
                  _at(12.0, Phase.rolling_back, 2, 57, "judged_failed"),
                  _at(12.5, Phase.rolling_back, 2, 56.5, "recovering"),
                  _at(14.0, Phase.rolled_back, 0, None, "converged")):
            lines(p)
        assert said == [
            "2026-12-03T09:30:00Z +   0.1s candidate 2.0.0 starting",
            "2026-12-03T09:30:01Z +   1.0s judging 2.0.0: attempt 1 of 3; deadline in 60s",
            "2026-12-03T09:30:09Z +   9.0s judging 2.0.0: attempt 2 of 3; deadline in 60s",
            "2026-12-03T09:30:12Z +  12.0s 2.0.0 judged failed; rolling back",
            "2026-12-03T09:30:14Z +  14.0s rolled back from 2.0.0",
        ]


def _until(said: list[str], text: str) -> Callable[[], None]:
    def wait() -> None:
        end = time.monotonic() + 10
        while not any(text in line for line in said) and time.monotonic() < end:
            time.sleep(0.01)
    return wait


class TestFollow:
    def test_a_rollback_followed_is_told_phase_by_phase(self, tmp_path: Path) -> None:
        """Following an upgrade whose candidate starts, is judged failed and rolled back, on the
        real clock: one line for each phase in order, then its outcome with the reason."""
        world = make_world(tmp_path / "root", clock=SystemClock())  # type: ignore[arg-type]
        world.installed("1.0.0")
        world.add_release("2.0.0")
        c = world.node.controller
        up = c.fire("begin_upgrade", release="2.0.0").upgrade
        assert up is not None
        said: list[str] = []

        def drive() -> None:
            _until(said, "starting")()
            c.fire("candidate_started")
            _until(said, "attempt 1 of 3")()
            c.fire("judge_failed", reason="the workload exited with status 3 while being "
                   "judged", reason_class="crashed")
            _until(said, "rolling back")()
            recover(world.node)
            c.fire("recovered")

        worker = threading.Thread(target=drive)
        worker.start()
        try:
            outcome = follow(world.node, up.started, "2.0.0", 30, on_progress=Lines(said.append))
        finally:
            worker.join()
        told = [line.split("s ", 1)[1] for line in said]
        assert told[1].startswith("judging 2.0.0: attempt 1 of 3; deadline in "), told
        assert told[:1] + told[2:] == ["candidate 2.0.0 starting",
                                       "2.0.0 judged failed; rolling back",
                                       "rolled back from 2.0.0"]
        assert (outcome.outcome, outcome.reason_class) == ("rolled_back", "crashed")
        assert outcome.reason == "the workload exited with status 3 while being judged"


class TestJudgmentRecorded:
    def test_the_checks_answers_then_the_soak_are_told(self, tmp_path: Path) -> None:
        """While the candidate is judged, its daemon's record gives the judging line each
        check's last answer, and the soak a line of its own with its time left."""
        world = make_world(tmp_path / "root", clock=SystemClock())  # type: ignore[arg-type]
        world.installed("1.0.0")
        world.add_release("2.0.0")
        c = world.node.controller
        up = c.fire("begin_upgrade", release="2.0.0").upgrade
        assert up is not None
        told = judgment.teller(world.paths, "2.0.0", 1)
        said: list[str] = []

        def drive() -> None:
            _until(said, "starting")()
            told([(("/usr/bin/probe",), False, 'probe exited 7: "db down"'),
                  (HttpCheck("http://127.0.0.1:8080/healthz"), True, "answered 200")], None)
            c.fire("candidate_started")
            _until(said, "attempt 1 of 3")()
            told([], 30)
            _until(said, "soak")()
            c.fire("judge_ok")
            c.fire("complete")

        worker = threading.Thread(target=drive)
        worker.start()
        try:
            follow(world.node, up.started, "2.0.0", 30, on_progress=Lines(said.append))
        finally:
            worker.join()
        told_ = [line.split("s ", 1)[1] for line in said]
        assert re.fullmatch(r'judging 2\.0\.0: attempt 1 of 3; deadline in \d+s; checks: probe '
                            r'exited 7: "db down", http://127\.0\.0\.1:8080/healthz ok',
                            told_[1]), told_
        assert re.fullmatch(r"judging 2\.0\.0: attempt 1 of 3; deadline in \d+s; checks passed, "
                            r"soak (30|29)s left", told_[2]), told_
        assert told_[3:] == ["2.0.0 judged ok; publishing the result", "converged on 2.0.0"]


class TestTerminal:
    def test_a_terminal_gets_one_live_line_left_at_the_end(self) -> None:
        """On a terminal the phases redraw one line in place (the cursor moved back up), and
        the last one stays."""
        screen = io.StringIO()
        console = Console(file=screen, force_terminal=True, width=100, color_system=None)
        with LiveLine(console) as line:
            line(_at(1.0, Phase.judging, 1, 42))
            line(_at(1.5, Phase.judging, 1, 41.5))
            line(_at(14.0, Phase.rolled_back, 0, None, "converged"))
        shown = screen.getvalue()
        assert "judging 2.0.0: attempt 1 of 3; deadline in 42s" in shown
        drawn = shown.split("\r\x1b[2K")  # each redraw goes back over the line and clears it
        assert len(drawn) == 4, shown
        assert drawn[-1].startswith("+   14s rolled back from 2.0.0\n"), shown

    def test_wait_on_a_terminal_is_the_full_clis(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """`upgrade --wait` with stdout a terminal goes to the full CLI, which draws the live
        line; piped, and without --wait, the fast path serves it."""
        assert fast_path.parse(["upgrade", "--to", "2.0.0", "--wait"]) is not None
        monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
        assert fast_path.parse(["upgrade", "--to", "2.0.0", "--wait"]) is None
        assert fast_path.parse(["upgrade", "--to", "2.0.0"]) is not None
