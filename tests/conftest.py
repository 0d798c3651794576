from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_fsm.actions.releases import libcache
from agent_fsm.agent.runtime import Waker
from tests.helpers import World, make_world

# A suite started in the background of a script (`cmd &`) inherits SIGINT ignored, and so would
# every agent-fsm it starts: the tests that stop `status --watch` with Ctrl-C need it delivered.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


_PACK_CACHE = pytest.StashKey[str]()
_LIB_CACHE = pytest.StashKey[str]()
_DEFAULT_CACHE = pytest.StashKey[tuple[int, int] | None]()


def pytest_configure(config: pytest.Config) -> None:
    """One cache of the releases the e2e lab packs, for the whole run: made by the first process
    (xdist's controller), whose workers inherit it; removed by that process at the end."""
    from agent_fsm_lab.lab import PACK_CACHE_ENV

    if PACK_CACHE_ENV not in os.environ:
        os.environ[PACK_CACHE_ENV] = tempfile.mkdtemp(prefix="agent-fsm-e2e-packs-")
        config.stash[_PACK_CACHE] = os.environ[PACK_CACHE_ENV]
    if libcache.ENV not in os.environ:  # the packs' cache of lib/: the run's own
        os.environ[libcache.ENV] = tempfile.mkdtemp(prefix="agent-fsm-lib-cache-")
        config.stash[_LIB_CACHE] = os.environ[libcache.ENV]
        config.stash[_DEFAULT_CACHE] = _default_lib_cache()


def pytest_unconfigure(config: pytest.Config) -> None:
    from agent_fsm_lab.lab import PACK_CACHE_ENV

    cache = config.stash.get(_PACK_CACHE, None)
    if cache is not None:
        shutil.rmtree(cache, ignore_errors=True)
        os.environ.pop(PACK_CACHE_ENV, None)
    lib_cache = config.stash.get(_LIB_CACHE, None)
    if lib_cache is not None:
        shutil.rmtree(lib_cache, ignore_errors=True)
        os.environ.pop(libcache.ENV, None)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The e2e tests first, in their order: each takes 10 s to a few minutes where a unit test
    takes well under one, so in one `pytest -n 4` of the whole suite the workers start them
    early and end on short unit tests, not on a long e2e test started last."""
    items.sort(key=lambda item: item.get_closest_marker("e2e") is None)


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


def _default_lib_cache() -> tuple[int, int] | None:
    """The default cache of packs' `lib/` (root's /var/cache/agent-fsm) as it is now."""
    try:
        st = os.lstat(libcache.default_dir())
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Fail the run when the default cache of packs' `lib/` changed during it: a pack in a
    process started without the run's environment (a sandbox's fixed one, a clean `env`) wrote
    the host's. A directory the run made is removed. Checked by the process that gave the run
    its own cache (xdist's controller), once all tests are done."""
    if _LIB_CACHE not in session.config.stash:
        return
    before = session.config.stash[_DEFAULT_CACHE]
    if _default_lib_cache() == before:
        return
    where = libcache.default_dir()
    if before is None:
        shutil.rmtree(where, ignore_errors=True)
    message = (f"FAILED: a pack wrote the default lib/ cache {where} during this run"
               f"{' (removed)' if before is None else ''}: give its process the run's "
               f"{libcache.ENV}")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(message, red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


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
