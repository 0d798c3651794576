from __future__ import annotations

import os
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


HOST_LINK = Path("/usr/local/bin/agent-fsm")  # the default `bin_link`: the host's, never a test's


@pytest.fixture(scope="session", autouse=True)
def host_link_untouched() -> Iterator[None]:
    """Fail the run if a test wrote the default `bin_link` on the host (a node opened without
    --root and with the default config writes it): remove that link, and name it."""
    before = HOST_LINK.is_symlink() or HOST_LINK.exists()
    yield
    if not before and HOST_LINK.is_symlink():
        target = os.readlink(HOST_LINK)
        HOST_LINK.unlink()
        pytest.fail(f"a test wrote {HOST_LINK} → {target} on the host (removed): give its "
                    "config `bin_link` below its temporary directory, or None", pytrace=False)


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
