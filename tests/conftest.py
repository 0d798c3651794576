from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_fsm.agent.runtime import Waker
from tests.helpers import World, make_world

# A suite started in the background of a script (`cmd &`) inherits SIGINT ignored, and so would
# every agent-fsm it starts: the tests that stop `status --watch` with Ctrl-C need it delivered.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def world(tmp_path: Path) -> World:
    """A fresh node below a temporary root: real files, fake systemctl, publisher and clock."""
    return make_world(tmp_path / "root")


@pytest.fixture
def waker() -> Iterator[Waker]:
    """The daemon's signal-driven sleeper, with this process's signal handlers restored after."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)}
    yield Waker()
    signal.set_wakeup_fd(-1)
    for s, h in saved.items():
        signal.signal(s, h)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say how many crash and power-loss points the run covered."""
    from tests.reliability import test_crash_points, test_power_loss

    if test_crash_points.COVERED:
        terminalreporter.write_line(
            f"crash points covered with SIGKILL: {len(test_crash_points.COVERED)} of "
            f"{len(test_crash_points.POINTS)} (every effect boundary of every transition)")
    if test_power_loss.COVERED:
        terminalreporter.write_line(
            f"power-loss points covered: {len(test_power_loss.COVERED)} (every file operation "
            f"of {len(test_power_loss.CASES)} transitions)")
    if test_power_loss.CYCLE_COVERED:
        terminalreporter.write_line(
            f"power-loss points covered across an upgrade cycle: "
            f"{len(test_power_loss.CYCLE_COVERED)}")
    # The model check's figures travel in its report (so they reach us from an xdist worker).
    for report in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", []):
        for name, value in getattr(report, "user_properties", []):
            if name == "modelcheck" and getattr(report, "when", "call") == "call":
                terminalreporter.write_line(f"model check: {value}")
