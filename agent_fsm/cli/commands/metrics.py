"""`agent-fsm metrics`: the node in Prometheus' text format, printed or written atomically."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ... import files
from .. import options


def metrics(
    ctx: typer.Context,
    output: Annotated[Path | None, typer.Option(
        "--output", metavar="PATH", help="Write the file atomically (for node_exporter's "
        "textfile collector, name it *.prom) instead of printing it.", show_default=False)
    ] = None,
) -> None:
    """Print the node's metrics in Prometheus' text format: the state, upgrades by outcome,
    rollbacks, attempts, seconds in the current state, the last transition's time.

    Example: agent-fsm metrics --output /var/lib/node_exporter/textfile/agent-fsm.prom
    """
    from ...views.metrics import collect, exposition

    text = exposition(collect(options.of(ctx).node()))
    if output is None:
        sys.stdout.write(text)
        return
    files.atomic_write(output, text.encode(), 0o644)
