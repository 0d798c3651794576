"""Run one transition in a process of its own, to be killed at a failpoint (see test_crash_points).

Usage: python -m tests.crash_child ROOT SYSTEMCTL TRIGGER ARGS_JSON
Everything is real (files, publisher, clock) but systemctl, which is a stub script that logs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from agent_fsm.system.systemd import Systemctl
from agent_fsm.wiring import open_node
from tests.helpers import DEFAULT_CONFIG


def main() -> None:
    root, systemctl, trigger, args = sys.argv[1:5]
    node = open_node(DEFAULT_CONFIG, Path(root), systemd=Systemctl(systemctl))
    node.controller.fire(trigger, **json.loads(args))


if __name__ == "__main__":
    main()
