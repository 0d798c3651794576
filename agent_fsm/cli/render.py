"""Output for people: the consoles, and the views of status, history and doctor as rich text.

Plain and unwrapped when piped; no styling at all with NO_COLOR. Text agent-fsm did not write (a
workload's words, reasons, errors quoting files, a command's output) goes through `untrusted.shown`,
cut to its bound. The consoles interpret no markup or emoji codes and show control characters
visibly, so nothing printed can move the cursor, retitle or clear a terminal.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from ..node.state.reasons import MAX_REASON
from ..untrusted import MAX_LINE, shown
from ..views.status.advice import restarts
from ..views.status.report import span

if TYPE_CHECKING:
    from ..views.doctor.checks import Finding
    from ..views.history import History


class _Console(Console):
    """A console that shows control characters visibly, as `untrusted.shown` does; rich's own
    escapes (styles, a live view's cursor moves) pass."""

    def render(self, renderable: RenderableType,
               options: ConsoleOptions | None = None) -> Iterable[Segment]:
        for seg in super().render(renderable, options):
            if seg.control is None and seg.text != "\n" and not seg.text.isprintable():
                seg = Segment(shown(seg.text, None, keep="\n"), seg.style)
            yield seg

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        # Piped text is plain, with no padding at line ends for a script to strip.
        text = super()._render_buffer(buffer)
        return text if self.is_terminal else "\n".join(
            line.rstrip(" ") for line in text.split("\n"))


# Piped, no line is wrapped or cut, whatever COLUMNS says: grep, logs and scripts read whole lines.
PIPED_WIDTH = 1 << 16


def _console(*, stderr: bool = False) -> Console:
    # NO_COLOR (https://no-color.org): no styling at all, so no escapes.
    plain = os.environ.get("NO_COLOR", "") != ""
    console = _Console(stderr=stderr, color_system=None if plain else "auto", highlight=False,
                       markup=False, emoji=False)
    if not console.is_terminal:
        console.soft_wrap = True
        console.width = PIPED_WIDTH
    return console


out = _console()
err = _console(stderr=True)

# A state's tone (from the definition, by the views) as a colour.
TONE_STYLE = {"ok": "green", "none": "dim", "busy": "yellow", "bad": "red"}


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=False))


def when(ts: float | None) -> str:
    if ts is None:
        return "—"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def words(value: str) -> str:
    """A value JSON spells as a name (`rolled_back`, `check_failed`) as people read it."""
    return value.replace("_", " ")


def commands(triggers: Sequence[str]) -> list[str]:
    """The `agent-fsm` commands that fire any of `triggers` (the machine's allowed ones)."""
    from ..machine.vocabulary import COMMANDS

    return [COMMANDS[t] for t in triggers if t in COMMANDS]


def show(renderable: RenderableType) -> None:
    """Print for people (piped: whole lines, no padding at their ends)."""
    out.print(renderable)


# status ---------------------------------------------------------------------------------------
def show_history(h: History) -> None:
    """The kept transitions as a table, or a line saying there are none (and why)."""
    if not h.entries:
        what = f"of an upgrade to {h.upgrade} " if h.upgrade else ""
        out.print(f"no transitions {shown(what)}in the kept history ({h.kept} kept, at most "
                  f"{h.limit})")
        return
    title = f"history of the upgrades to {shown(h.upgrade)}" if h.upgrade else "history"
    table = Table(title=title + " (times in UTC)", title_justify="left")
    for col in ("time", "trigger", "from → to", "versions", "lasted", "why"):
        table.add_column(col, no_wrap=col not in ("lasted", "why"))
    for e in h.entries:
        versions = shown(f"{e.upgrade[0]} → {e.upgrade[1]}" if e.upgrade else (e.release or ""))
        lasted = "" if e.lasted is None else span(e.lasted) + (" so far" if e.current else "")
        move = Text(f"{shown(e.source)} → ")
        move.append(shown(e.dest), style=TONE_STYLE.get(h.tones.get(e.dest, ""), ""))
        stamp = datetime.fromtimestamp(e.time, UTC).strftime("%Y-%m-%d %H:%M:%S")
        why = "" if e.reason is None else \
            f"{words(shown(e.reason[0]))}: {shown(e.reason[1], MAX_REASON)}"
        if e.superseded_by:  # owed, never finished: the way back replaced it
            why = f"superseded by {shown(e.superseded_by)}" + (
                f" ({shown(', '.join(e.unknown))} unknown here)" if e.unknown else "")
        if e.crash_loop is not None:  # one entry for a crash loop: its count, since when
            first = datetime.fromtimestamp(e.crash_loop[1], UTC).strftime("%Y-%m-%d %H:%M:%S")
            why = restarts(e.crash_loop[0], first, f"at {stamp}")
        table.add_row(stamp, shown(e.trigger), move, versions, lasted, why)
    show(table)
    if h.kept >= h.limit and len(h.entries) == h.kept:
        out.print(Text(f"older transitions were trimmed (history_limit = {h.limit})",
                       style="dim"))


def show_doctor(findings: Sequence[Finding]) -> None:
    """The findings as a table: level, check, and what to do about each that is not ok."""
    table = Table(box=None, show_header=False, pad_edge=False)
    for col in ("level", "check", "finding"):
        table.add_column(col)
    mark = {"ok": "ok", "warn": "WARN", "fail": "FAIL"}
    for f in findings:
        detail = shown(f.detail, MAX_LINE) + (
            f"\n→ {shown(f.fix, MAX_LINE)}" if f.fix and f.level != "ok" else "")
        table.add_row(mark[f.level], shown(f.check), detail)
    out.print(table)
