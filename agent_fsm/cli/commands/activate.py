"""`agent-fsm activate`: switch directly to a release, without judgment."""

from __future__ import annotations

from typing import Annotated

import typer

from .. import options
from ..render import out


def activate(
    ctx: typer.Context,
    to: Annotated[str, typer.Option("--to", help="A stored release to switch to.")],
) -> None:
    """Switch directly to a release without judgment: no signal, all assets written.

    Example: agent-fsm activate --to 1.0.0
    """
    from ...actions.operations import activate as do_activate

    out.print(do_activate(options.of(ctx).node(), to).message, markup=False)
