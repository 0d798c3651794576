"""`agent-fsm install`: select and trust a release, write all assets, reload, enable, start."""

from __future__ import annotations

from typing import Annotated

import typer

from .. import options
from ..render import out


def install(
    ctx: typer.Context,
    version: Annotated[str, typer.Option("--version", help="A stored release to install.")],
    no_start: Annotated[bool, typer.Option("--no-start", help="Write and reload only.")] = False,
) -> None:
    """Install a release: select and trust it, write all assets, reload, enable and start.

    Example: agent-fsm install --version 1.0.0
    """
    from ...actions.operations import install as do_install

    out.print(do_install(options.of(ctx).node(), version, start=not no_start).message, markup=False)
