"""Fixtures for the end-to-end tests: a private systemd per test (see sandbox.py).

`systemd_sandbox` is the host's systemd (252 on Debian 12). `node_sandbox` is the same, once
for each kind of node the suite proves agent-fsm on, with the ids `systemd252` (the host's) and
`systemd257` (a Debian 13 node: systemd 257, Python 3.13, booted from the root file system
`agent_fsm_lab.rootfs` builds once into its cache): a test or module opts in to both by using it.
A 257 parametrization that fails only for a known, not yet fixed difference of systemd 257 is
marked `@pytest.mark.xfail_systemd257(reason=...)`: strict, so it must be removed with the fix.

`systemd_sandbox` and `node_sandbox` are shared: one booted systemd per module (and node kind)
serves its tests in turn, each in a fresh test directory of its own (`test_dir`), with the unit
files, units, failed states and journal of the test before it gone (`SharedNode.reset`). A test
that fails, reboots or shuts its systemd down leaves it to no one: the next test boots another.
A test that needs a systemd nothing ran on before takes `unbooted_sandbox` and boots it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest

from agent_fsm_lab import rootfs
from agent_fsm_lab.sandbox import (
    DEFAULT_BASE_DIR,
    SandboxError,
    SystemdSandbox,
    missing_requirements,
    python_paths,
)

NODES = ("systemd252", "systemd257")


def require_sandbox(*also_missing: str, what: str = "e2e tests need") -> None:
    """Skip when this machine cannot boot a sandbox (or lacks what `also_missing` names); fail
    instead in CI (CI=true)."""
    missing = [*missing_requirements(), *also_missing]
    if not missing:
        return
    reason = f"{what} " + "; ".join(missing)
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: the e2e suite must not be skipped)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def unbooted_sandbox() -> Iterator[SystemdSandbox]:
    """A sandbox not yet booted (call `boot()`); shut down after the test whatever happens."""
    require_sandbox()
    sandbox = SystemdSandbox(keep=python_paths())  # a checkout under /tmp stays visible
    try:
        yield sandbox
    finally:
        sandbox.shutdown()


_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None],
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Remember a test that failed (its setup or call), so its systemd is shared no further."""
    report: pytest.TestReport = yield
    if report.failed:
        item.stash[_FAILED] = True
    return report


class SharedNode:
    """One booted sandbox that the tests of a module use in turn (`lease`), each in a fresh test
    directory, with what the test before it left in systemd taken away (`reset`)."""

    def __init__(self, make: Callable[[], SystemdSandbox]) -> None:
        self.make = make
        self.sandbox: SystemdSandbox | None = None
        self.unit_files: set[str] = set()  # in the unit directory once booted
        self.active: set[str] = set()  # units active once booted
        self.leases = 0

    @contextlib.contextmanager
    def lease(self, item: pytest.Item) -> Iterator[SystemdSandbox]:
        if self.sandbox is None:
            sandbox = self.make()
            sandbox.boot()
            self.sandbox = sandbox
            self.unit_files = set(os.listdir(sandbox.host_path(sandbox.UNIT_DIR)))
            self.active = _active_units(sandbox)
        sandbox = self.sandbox
        root, pid = sandbox.test_dir, sandbox.pid
        self.leases += 1
        fresh = root / f"test-{self.leases}"
        fresh.mkdir(mode=0o755)
        sandbox.test_dir = fresh  # a directory below the root's: the same path inside too
        try:
            yield sandbox
        finally:
            sandbox.test_dir = root
            kept = not item.stash.get(_FAILED, False) and _pid(sandbox) == pid
            try:
                if kept:
                    self.reset(sandbox, fresh)
            except Exception:  # whatever it was, the next test gets a systemd of its own
                kept = False
            if kept:
                # Seconds of unlinking (the releases in its store and packs): moved aside at
                # once and removed while the next tests run, which mostly wait on systemd.
                _remove_later(fresh, sandbox.base_dir)
            else:
                self.close()  # its whole test directory with it

    def reset(self, sandbox: SystemdSandbox, test_dir: Path) -> None:
        """Stop every unit the test started, unmount what it mounted in its `test_dir`, remove
        the unit files and drop-ins it wrote (the boot's own stay), forget failed states and
        start counts, and start an empty journal: the next test finds systemd as booted, and
        `journal()` shows only its own lines."""
        started = sorted(_active_units(sandbox) - self.active)
        if started:
            sandbox.systemctl("stop", *started)
        mountinfo = Path(f"/proc/{sandbox.pid}/mountinfo").read_text().splitlines()
        mounted = {line.split()[4] for line in mountinfo}
        for point in sorted((m for m in mounted if m.startswith(f"{test_dir}/")), reverse=True):
            sandbox.run("umount", "--lazy", point)
        unit_dir = sandbox.host_path(sandbox.UNIT_DIR)
        for name in sorted(set(os.listdir(unit_dir)) - self.unit_files):
            path = unit_dir / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        sandbox.systemctl("daemon-reload")
        sandbox.systemctl("reset-failed")
        sandbox.systemctl("stop", *_JOURNAL)
        sandbox.run("sh", "-c", "rm -rf /run/log/journal/* /var/log/journal/*")
        sandbox.start_journal()
        left = sorted(_active_units(sandbox) - self.active)
        if left:
            raise RuntimeError(f"units still active after the reset: {left}")

    def close(self) -> None:
        if self.sandbox is not None:
            sandbox, self.sandbox = self.sandbox, None
            sandbox.shutdown()


_REMOVALS: list[threading.Thread] = []


def _remove_later(directory: Path, base_dir: Path) -> None:
    """Rename `directory` aside (below `base_dir`, on the same file system) and remove it in a
    thread; the session's end waits for every such thread."""
    trash = base_dir / f".removed-{uuid.uuid4().hex[:12]}"
    try:
        directory.rename(trash)
    except OSError:
        trash = directory
    removal = threading.Thread(target=shutil.rmtree, args=(trash,),
                               kwargs={"ignore_errors": True}, name=f"rm {trash.name}")
    removal.start()
    _REMOVALS.append(removal)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Wait for the test directories still being removed, then remove the sandboxes' base
    directory if nothing else uses it."""
    for removal in _REMOVALS:
        removal.join()
    with contextlib.suppress(OSError):
        DEFAULT_BASE_DIR.rmdir()


_JOURNAL = ("systemd-journald.service", "systemd-journald.socket",
            "systemd-journald-dev-log.socket")


def _active_units(sandbox: SystemdSandbox) -> set[str]:
    """The units active (or activating, deactivating, failed-but-running) now, by name."""
    lines = sandbox.systemctl("list-units", "--plain", "--no-legend", "--full", "--all",
                              "--state=active,activating,deactivating,reloading",
                              "--type=service,socket,timer,path").stdout.splitlines()
    return {line.split()[0] for line in lines if line.strip()}


def _pid(sandbox: SystemdSandbox) -> int | None:
    """systemd's pid, None once the test shut it down."""
    try:
        return sandbox.pid
    except SandboxError:
        return None


@pytest.fixture(scope="module")
def _shared_252() -> Iterator[SharedNode]:
    require_sandbox()
    shared = SharedNode(lambda: SystemdSandbox(keep=python_paths()))
    try:
        yield shared
    finally:
        shared.close()


@pytest.fixture
def systemd_sandbox(_shared_252: SharedNode,
                    request: pytest.FixtureRequest) -> Iterator[SystemdSandbox]:
    """A booted private systemd (journald running), shared with the module's other tests (see
    the module docstring): a fresh `test_dir`, no unit of another test."""
    with _shared_252.lease(request.node) as sandbox:
        yield sandbox


@pytest.fixture
def can_boot_sandbox() -> None:
    """For tests that boot their own sandbox (the demo): skip or fail as the fixtures above."""
    require_sandbox()


@pytest.fixture(scope="session")
def debian13_node() -> rootfs.Node:
    """The Debian 13 node's tree, built into the cache if missing (~70 s)."""
    require_sandbox(*rootfs.missing_requirements(),
                    what="the Debian 13 node (systemd 257, Python 3.13) needs")
    try:
        node = rootfs.ensure_rootfs()
    except rootfs.RootfsError as exc:  # a build that fails is a failure, never a skip
        pytest.fail(f"could not build the Debian 13 node: {exc}", pytrace=False)
    return node


@pytest.fixture
def debian13(debian13_node: rootfs.Node) -> Iterator[SystemdSandbox]:
    """A booted Debian 13 node (systemd 257, Python 3.13) alone; shut down after the test."""
    require_sandbox(*missing_requirements(debian13_node.rootfs), what="the Debian 13 node needs")
    sandbox = rootfs.sandbox(debian13_node)
    try:
        sandbox.boot()
        yield sandbox
    finally:
        sandbox.shutdown()


@pytest.fixture(params=NODES)
def unbooted_node_sandbox(request: pytest.FixtureRequest) -> Iterator[SystemdSandbox]:
    """A sandbox not yet booted, of each node kind (ids `systemd252`, `systemd257`)."""
    if request.param == "systemd252":
        require_sandbox()
        sandbox = SystemdSandbox(keep=python_paths())
    else:
        node: rootfs.Node = request.getfixturevalue("debian13_node")
        require_sandbox(*missing_requirements(node.rootfs), what="the Debian 13 node needs")
        sandbox = rootfs.sandbox(node)
    try:
        yield sandbox
    finally:
        sandbox.shutdown()


@pytest.fixture(scope="module")
def node_keep() -> tuple[Path, ...]:
    """Host directories the 257 node shows read-only at the same path (the 252 node sees the
    host's file system): a module overrides this to share what it made once."""
    return ()


@pytest.fixture(scope="module", params=NODES)
def _shared_node(request: pytest.FixtureRequest,
                 node_keep: tuple[Path, ...]) -> Iterator[SharedNode]:
    if request.param == "systemd252":
        require_sandbox()
        shared = SharedNode(lambda: SystemdSandbox(keep=python_paths()))
    else:
        node: rootfs.Node = request.getfixturevalue("debian13_node")
        require_sandbox(*missing_requirements(node.rootfs), what="the Debian 13 node needs")
        shared = SharedNode(lambda: rootfs.sandbox(node, keep=node_keep))
    try:
        yield shared
    finally:
        shared.close()


@pytest.fixture
def node_sandbox(_shared_node: SharedNode,
                 request: pytest.FixtureRequest) -> Iterator[SystemdSandbox]:
    """A booted private systemd of each node kind (journald running), shared with the module's
    other tests of that kind as `systemd_sandbox` is."""
    with _shared_node.lease(request.node) as sandbox:
        yield sandbox


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`xfail_systemd257(reason=...)`: the test's systemd257 parametrization is a strict xfail."""
    for item in items:
        marker = item.get_closest_marker("xfail_systemd257")
        callspec = getattr(item, "callspec", None)
        if marker is not None and callspec is not None and "systemd257" in callspec.id.split("-"):
            item.add_marker(pytest.mark.xfail(strict=True, reason=marker.kwargs["reason"]))
