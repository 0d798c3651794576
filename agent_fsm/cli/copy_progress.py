"""How far `release add`, `install --from` and `release pack` are, on stderr (stdout keeps the
result).

On a terminal: a rich bar (bytes and files). Piped: one timestamped line at most every
AGENT_FSM_PROGRESS_SECONDS (default 5), and a last one when a shown copy ends. For example:
`2026-12-03T09:30:01Z adding ./myagent-1.2.0: 40% 600 MiB of 1.5 GiB, 8,000 of 20,000 files`.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator

from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

from ..node.releases.moving import Moved, Report
from ..node.store_config import size_text
from ..untrusted import MAX_LINE, shown
from .progress import stamp
from .render import err

INTERVAL_ENV = "AGENT_FSM_PROGRESS_SECONDS"
INTERVAL = 5.0


def words(m: Moved) -> str:
    """`adding ./rel: 40% 600 MiB of 1.5 GiB, 8,000 of 20,000 files`. An archive's files are unknown
    until its end: `unpacking ./rel.tar.gz: 40% of 1.5 GiB read, 8,000 files`."""
    if m.note:  # a tool's own word on where it is (podman's pull)
        return f"{m.doing} {shown(m.what, MAX_LINE)}: {shown(m.note, MAX_LINE)}"
    part = m.fraction
    pct = "" if part is None else f"{part:.0%} "
    head = f"{m.doing} {shown(m.what, MAX_LINE)}: {pct}"
    if m.total_files is None:
        return head + f"of {size_text(m.total_bytes or 0)} read, {m.files:,} files"
    return head + (f"{size_text(m.bytes)} of {size_text(m.total_bytes or 0)}, "
                   f"{m.files:,} of {m.total_files:,} files")


def interval() -> float:
    """The seconds between piped lines: AGENT_FSM_PROGRESS_SECONDS, else INTERVAL."""
    try:
        return max(float(os.environ.get(INTERVAL_ENV, INTERVAL)), 0.0)
    except ValueError:
        return INTERVAL


class Lines:
    """Says where each copy is `every` seconds after its start or last line, and at its end if it
    said anything. A small copy says nothing."""

    def __init__(self, say: Callable[[str], None], every: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._say, self._every, self._clock = say, every, clock
        self._copy: tuple[str, str] | None = None
        self._last = 0.0
        self._said = False

    def __call__(self, m: Moved) -> None:
        now = self._clock()
        if self._copy != (m.doing, m.what):
            self._copy, self._last, self._said = (m.doing, m.what), now, False
        if (m.done and self._said) or (not m.done and now - self._last >= self._every):
            self._say(f"{stamp(time.time())} {words(m)}")
            self._last, self._said = now, True


class Bar:
    """A rich progress bar for each copy, on the terminal's stderr."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._tasks: dict[tuple[str, str], TaskID] = {}

    def __call__(self, m: Moved) -> None:
        key = (m.doing, m.what)
        files = shown(m.note, 60) if m.note else f"{m.files:,}" + (
            " files" if m.total_files is None else f"/{m.total_files:,} files")
        if key not in self._tasks:
            self._tasks[key] = self._progress.add_task(
                f"{m.doing} {shown(m.what, 80)}", total=m.total_bytes, files=files)
        self._progress.update(self._tasks[key], completed=m.bytes, files=files)


@contextlib.contextmanager
def shown_on_stderr(quiet: bool = False) -> Iterator[Report | None]:
    """The callback that shows progress for the block: a bar on a terminal, lines when piped,
    none when `quiet`."""
    if quiet:
        yield None
        return
    if not err.is_terminal:
        yield Lines(lambda line: err.print(line, markup=False, soft_wrap=True), interval())
        return
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True),
               TextColumn("{task.fields[files]}"), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=False) as progress:
        yield Bar(progress)
