"""Progress of a long copy into or out of the store: `release add` (a directory, an archive, an
image's tree) and `release pack`'s payload. The copy counts as it goes (`Meter`) and hands a frozen
`Moved` to the CLI's callback, which decides what to show and how often. A NamedTuple: `status`
imports the store's modules and no dataclasses."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple


class Moved(NamedTuple):
    """`doing` (`adding`, `unpacking`, `packing`) `what` (a path or reference as the operator named
    it): `files` and `bytes` so far of `total_files` and `total_bytes` (None: unknown until the end,
    as in an archive). `done`: the copy's last record. `note`: the tool's last words (podman's pull:
    "Copying blob sha256:…")."""

    doing: str
    what: str
    files: int
    bytes: int
    total_files: int | None
    total_bytes: int | None
    done: bool = False
    note: str = ""

    @property
    def fraction(self) -> float | None:
        """The fraction done, 0 to 1, by bytes (by files when there are no bytes); None when the
        total is unknown."""
        if self.total_bytes:
            return min(self.bytes / self.total_bytes, 1.0)
        if self.total_files:
            return min(self.files / self.total_files, 1.0)
        return None if self.total_bytes is None else 1.0


Report = Callable[[Moved], None]


class Meter:
    """Counts one copy's files and bytes and reports each change to `report`."""

    def __init__(self, report: Report, doing: str, what: str, total_files: int | None = None,
                 total_bytes: int | None = None) -> None:
        self._report = report
        self.doing, self.what = doing, what
        self.total_files, self.total_bytes = total_files, total_bytes
        self.files = self.bytes = 0

    def record(self, *, done: bool = False) -> Moved:
        return Moved(self.doing, self.what, self.files, self.bytes, self.total_files,
                     self.total_bytes, done)

    def moved(self, nbytes: int = 0, files: int = 0) -> None:
        self.bytes += nbytes
        self.files += files
        self._report(self.record())

    def at(self, nbytes: int, files: int) -> None:
        """Set how far it is (a reader that knows its position)."""
        self.bytes, self.files = nbytes, files
        self._report(self.record())

    def done(self) -> None:
        self._report(self.record(done=True))
