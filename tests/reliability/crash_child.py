"""Run one transition in a process of its own, to be killed at a failpoint (see test_crash_points).

Usage: python -m tests.reliability.crash_child ROOT SYSTEMCTL TRIGGER ARGS_JSON
Everything is real (files, publisher, clock) but systemctl, which is a stub script that logs.
With $KILL_AFTER_APPEND set, the process is killed just after the history journal's append,
before the state file that commits it is written.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from agent_fsm.node.state.journal import Journal
from agent_fsm.system.systemd import Systemctl
from agent_fsm.wiring import open_node
from tests.helpers import DEFAULT_CONFIG

KILL_AFTER_APPEND = "KILL_AFTER_APPEND"


def main() -> None:
    root, systemctl, trigger, args = sys.argv[1:5]
    if os.environ.get(KILL_AFTER_APPEND):
        append = Journal.append

        def append_then_die(journal: Journal, *a: Any) -> None:
            append(journal, *a)
            os.kill(os.getpid(), signal.SIGKILL)

        Journal.append = append_then_die  # type: ignore[method-assign]
    node = open_node(DEFAULT_CONFIG, Path(root), systemd=Systemctl(systemctl))
    node.controller.fire(trigger, **json.loads(args))


if __name__ == "__main__":
    main()
