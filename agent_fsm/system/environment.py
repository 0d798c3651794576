"""The environment of a child agent-fsm starts: its own, less systemd's notify and watchdog
variables.

Every child (checks, hooks, the publish command, systemctl, podman, journalctl) gets
`child_environment`; the workload's is built from nothing (`system.workload`). The variables in
`SYSTEMD_ONLY` belong to the unit's main process alone (sd_notify(3), sd_watchdog_enabled(3)): a
child using them would speak for the unit (`READY=1`, `WATCHDOG=1`) or take the daemon's watchdog.
Light: `status` imports it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

SYSTEMD_ONLY = frozenset({"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"})


def child_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment less `SYSTEMD_ONLY`, with `extra` on top."""
    env = {k: v for k, v in os.environ.items() if k not in SYSTEMD_ONLY}
    env.update(extra or {})
    return env
