"""`upgrade --wait` on a terminal: one live line saying where the upgrade is. It is redrawn at each
read, its countdown kept current, and left in place at the end."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.live import Live
from rich.text import Text

from ..actions.upgrade import Phase, Progress
from .progress import words
from .render import TONE_STYLE, out

_TONES = {Phase.converged: "ok", Phase.rolled_back: "bad", Phase.rolling_back: "bad",
          Phase.other: "none"}


class LiveLine:
    """A context whose call shows a `Progress` on the terminal's live line."""

    def __init__(self, console: Console = out) -> None:
        self._live = Live(Text(""), console=console, auto_refresh=False, transient=False)

    def __enter__(self) -> LiveLine:
        self._live.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._live.stop()

    def __call__(self, p: Progress) -> None:
        line = Text(f"+{p.after:5.0f}s ", style="dim")
        line.append(words(p), style=TONE_STYLE[_TONES.get(p.phase, "busy")])
        self._live.update(line, refresh=True)
