"""`agent-fsm history`: the transitions the machine went through, oldest first."""

from __future__ import annotations

from typing import Annotated

import typer

from .. import options, render


def history(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="A JSON list, oldest first.")] = False,
    limit: Annotated[int, typer.Option(
        "--limit", min=1, metavar="N", help="Show the last N transitions.")] = 50,
    upgrade: Annotated[str | None, typer.Option(
        "--upgrade", metavar="VERSION", help="Only the transitions of upgrades to VERSION.",
        show_default=False)] = None,
) -> None:
    """Show the transitions the machine went through, oldest first.

    Each: when, the trigger, from → to, the versions, and how long the node stayed. history.jsonl
    beside state.json keeps the last `history_limit` (default 200).

    Example: agent-fsm history --upgrade 2.0.0 --limit 10
    """
    from ...views.history import history as get_history

    h = get_history(options.of(ctx).node(), limit=limit, upgrade=upgrade)
    if as_json:
        render.print_json(h.to_json())
        return
    render.show_history(h)
