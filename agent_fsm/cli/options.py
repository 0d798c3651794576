"""The global options (--config, --root) every command receives as `ctx.obj`.

Kept free of typer and rich: the `status --json` fast path (entry.py) uses it as the full CLI does.
"""

from __future__ import annotations

import contextlib
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

    def node(self, *, way_back: bool = False, command: Command | None = None) -> Node:
        """The node these options name: its config loaded, its paths below the root.

        `way_back` (`daemon`, `recover`): unknown keys are logged, not refused, as a config written
        for a newer candidate must not stop the last-good; a config wrong otherwise gives way to the
        last-good's kept settings (`config.fallback`). `command`: this process
        (`upgrade.roles.Command`; default an operator's), for the roles' checks. A valid config is
        kept as the last-good's settings (`Node.keep_settings`), so a fallback never runs settings
        older than it.
        """
        from ..errors import AgentFsmError
        from ..node import config as config_mod
        from ..upgrade.roles import Command
        from ..wiring import open_node

        role = Command.operator if command is None else command
        if way_back:
            from ..node.config_fallback import way_back_config

            node = open_node(way_back_config(self.config, self.root), self.root, command=role)
        else:
            node = open_node(config_mod.load(self.config, self.root), self.root, command=role)
        # A full or read-only disk stops nothing: the next read keeps them.
        with contextlib.suppress(AgentFsmError, OSError):
            node.keep_settings()
        return node

    def reader(self, *, way_back: bool = False) -> Reader:
        """The node these options name, wired for reading only (`status` and the start check).

        The engine, the effects, the publisher and the hooks' runner are not imported. A config the
        way back would not use either is refused; one it replaces with the last-good's kept settings
        is read through them, and `status` says so. `way_back` (`start-check`): the config is read
        as the way back reads it, unknown keys logged.
        """
        from ..errors import ConfigError
        from ..node import config as config_mod
        from ..wiring import open_reader

        if way_back:
            from ..node.config_fallback import way_back_config

            return open_reader(way_back_config(self.config, self.root), self.root)
        try:
            config = config_mod.load(self.config, self.root)
        except ConfigError:
            from ..node.config_fallback import way_back_config

            config = way_back_config(self.config, self.root, quiet=True)
            if config.fallback is None:  # the file is wrong only for operators (unknown keys)
                raise
        return open_reader(config, self.root)

    def words(self) -> list[str]:
        """These options as a command line gives them."""
        words = []
        if self.config is not None:
            words += ["--config", str(self.config)]
        if self.root is not None:
            words += ["--root", str(self.root)]
        return words

    def prog(self) -> str:
        """How this run was invoked, for the commands `status` suggests."""
        return shlex.join(["agent-fsm", *self.words()])


def of(ctx: typer.Context) -> Globals:
    """The global options of this run, as app.py's callback stored them."""
    opts = ctx.find_object(Globals)
    assert opts is not None, "the app's callback sets ctx.obj before any command runs"
    return opts
