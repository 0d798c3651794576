"""`agent-fsm recover`: roll back to the last-good release when an upgrade is not judged ok."""

from __future__ import annotations

import typer

from .. import options


def recover(ctx: typer.Context) -> None:
    """Roll back to the last-good release when an upgrade is pending and not judged ok.

    Safe to run twice; with nothing pending it says so and exits 0. The recovery unit runs it
    through the last-good's recovery script.

    Example: agent-fsm recover
    """
    from ..fast_path import run_recover  # the code `agent-fsm recover` runs without the full CLI

    raise typer.Exit(run_recover(options.of(ctx)))
