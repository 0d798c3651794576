from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import World, make_world


@pytest.fixture
def world(tmp_path: Path) -> World:
    """A fresh node below a temporary root: real files, fake systemctl, publisher and clock."""
    return make_world(tmp_path / "root")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say how many crash and power-loss points the run covered."""
    from tests import test_crash_points, test_power_loss

    if test_crash_points.COVERED:
        terminalreporter.write_line(
            f"crash points covered with SIGKILL: {len(test_crash_points.COVERED)} of "
            f"{len(test_crash_points.POINTS)} (every effect boundary of every transition)")
    if test_power_loss.COVERED:
        terminalreporter.write_line(
            f"power-loss points covered: {len(test_power_loss.COVERED)} (every file operation "
            f"of {len(test_power_loss.CASES)} transitions)")
