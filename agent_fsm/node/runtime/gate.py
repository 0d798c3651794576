"""The startup gate: a runtime file whose presence lets operations (another upgrade too) start.

It lives in the run directory, which systemd creates when the agent unit starts and removes when it
stops (`RuntimeDirectory=`, on a tmpfs). So the gate is closed at every boot and whenever the agent
is not running. No other process (a `recover` finishing the agent's owed work) can open it for an
agent that is down.
"""

from __future__ import annotations

from pathlib import Path

from ... import files


class Gate:
    def __init__(self, path: Path) -> None:
        self.path = path

    def is_open(self) -> bool:
        return self.path.exists()

    def open(self) -> bool:
        """Open the gate. False, writing nothing, when the run directory is absent: the agent unit
        is not running."""
        try:
            files.atomic_write(self.path, b"open\n", 0o644, create_dir=False)
        except FileNotFoundError:
            return False
        return True

    def close(self) -> None:
        """Close the gate; DiskError when the disk fails it."""
        files.remove(self.path)
