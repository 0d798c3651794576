"""The startup gate: a runtime file whose presence lets operations (another upgrade too) start.

It lives under the run directory (a tmpfs on a real host), so every boot starts with it closed.
"""

from __future__ import annotations

from pathlib import Path

from .. import files


class Gate:
    def __init__(self, path: Path) -> None:
        self.path = path

    def is_open(self) -> bool:
        return self.path.exists()

    def open(self) -> None:
        files.atomic_write(self.path, b"open\n", 0o644)

    def close(self) -> None:
        files.remove(self.path)
