"""The global options (--config, --root) every command receives as `ctx.obj`.

Kept free of typer and rich: the `status --json` fast path (entry.py) uses it as the full CLI does.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import typer

    from ..upgrade.roles import Command
    from ..wiring import Node, Reader


class Globals(NamedTuple):
    """The options given before the command: which config, and which root to write below."""

    config: Path | None = None
    root: Path | None = None

    def node(self, *, lenient: bool = False, command: Command | None = None) -> Node:
        """The node these options name: its config loaded, its paths below the root.
        `lenient`: unknown config keys are logged, not refused (the way back: a config written
        for the candidate, a newer agent-fsm, must not stop the last-good's daemon or recover).
        `command`: which process this is (`upgrade.roles.Command`; default: an operator's), for
        the roles' checks."""
        from ..node import config as config_mod
        from ..upgrade.roles import Command
        from ..wiring import open_node

        return open_node(config_mod.load(self.config, self.root, lenient=lenient), self.root,
                         command=Command.operator if command is None else command)

    def reader(self) -> Reader:
        """The node these options name, wired for reading only (`status`, with or without
        --json): none of the engine, the effects, the publisher or the hooks' runner is imported."""
        from ..node import config as config_mod
        from ..wiring import open_reader

        return open_reader(config_mod.load(self.config, self.root), self.root)

    def prog(self) -> str:
        """How this run was invoked, for the commands `status` suggests."""
        words = ["agent-fsm"]
        if self.config is not None:
            words += ["--config", str(self.config)]
        if self.root is not None:
            words += ["--root", str(self.root)]
        return shlex.join(words)


def of(ctx: typer.Context) -> Globals:
    """The global options of this run, as app.py's callback stored them."""
    opts = ctx.find_object(Globals)
    assert opts is not None, "the app's callback sets ctx.obj before any command runs"
    return opts
