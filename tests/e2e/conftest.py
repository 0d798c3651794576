"""Fixtures for the end-to-end tests: a private systemd per test (see sandbox.py).

`systemd_sandbox` is the host's systemd (252 on Debian 12). `node_sandbox` is the same, once
for each kind of node the suite proves agent-fsm on, with the ids `systemd252` (the host's) and
`systemd257` (a Debian 13 node: systemd 257, Python 3.13, booted from the root file system
`agent_fsm_lab.rootfs` builds once into its cache): a test or module opts in to both by using it.
A 257 parametrization that fails only for a known, not yet fixed difference of systemd 257 is
marked `@pytest.mark.xfail_systemd257(reason=...)`: strict, so it must be removed with the fix.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from agent_fsm_lab import rootfs
from agent_fsm_lab.sandbox import SystemdSandbox, missing_requirements, python_paths

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


@pytest.fixture
def systemd_sandbox(unbooted_sandbox: SystemdSandbox) -> SystemdSandbox:
    """A booted private systemd (journald running); shut down after the test."""
    unbooted_sandbox.boot()
    return unbooted_sandbox


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


@pytest.fixture
def node_sandbox(unbooted_node_sandbox: SystemdSandbox) -> SystemdSandbox:
    """A booted private systemd of each node kind (journald running); shut down after the test."""
    unbooted_node_sandbox.boot()
    return unbooted_node_sandbox


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`xfail_systemd257(reason=...)`: the test's systemd257 parametrization is a strict xfail."""
    for item in items:
        marker = item.get_closest_marker("xfail_systemd257")
        callspec = getattr(item, "callspec", None)
        if marker is not None and callspec is not None and "systemd257" in callspec.id.split("-"):
            item.add_marker(pytest.mark.xfail(strict=True, reason=marker.kwargs["reason"]))
