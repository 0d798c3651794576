"""Fixtures for the end-to-end tests: a private systemd per test (see sandbox.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from agent_fsm_lab.sandbox import SystemdSandbox, missing_requirements, python_paths


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
