"""`agent-fsm metrics`: the node in Prometheus' text format, printed or written atomically."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ... import files
from ...errors import EXIT_USAGE
from ...node.config import own_directories
from .. import options

if TYPE_CHECKING:
    from ...wiring import Node


def _refuse(output: Path, why: str) -> typer.Exit:
    sys.stderr.write(f"agent-fsm: metrics: refusing --output {str(output)!r}: {why}; nothing "
                     "was written\n")
    return typer.Exit(EXIT_USAGE)


def _check_output(output: Path, node: Node | None) -> None:
    """--output must name a `*.prom` file outside agent-fsm's own directories (state, lib, unit,
    run), wherever symlinks lead; else a one-line usage error (exit 2). `node` None: the suffix
    only."""
    if not output.name.endswith(".prom") or output.name == ".prom":
        raise _refuse(output, "the file must be named *.prom (node_exporter's textfile "
                      "collector reads only those)")
    if node is None:
        return
    where = Path(os.path.realpath(output.parent)) / output.name
    config = node.paths.config
    for key, host in own_directories(config):
        directory = node.paths.real(host)
        real = Path(os.path.realpath(directory))
        if where == real or real in where.parents:
            raise _refuse(output, f"it is inside agent-fsm's {key} {directory}; write it to the "
                          "textfile collector's directory")


def metrics(
    ctx: typer.Context,
    output: Annotated[Path | None, typer.Option(
        "--output", metavar="PATH", help="Write the file atomically (for node_exporter's "
        "textfile collector) instead of printing it. PATH must end in .prom and lie outside "
        "agent-fsm's state, lib, unit and run dirs, else a usage error (exit 2).",
        show_default=False)] = None,
) -> None:
    """Print the node's metrics in Prometheus' text format.

    They are the state, upgrades by outcome, rollbacks, attempts, seconds in the current state and
    the last transition's time.

    Example: agent-fsm metrics --output /var/lib/node_exporter/textfile/agent-fsm.prom
    """
    from ...views.metrics import collect, exposition

    if output is not None:
        _check_output(output, None)
    node = options.of(ctx).node()
    if output is not None:
        _check_output(output, node)
    text = exposition(collect(node))
    if output is None:
        sys.stdout.write(text)
        return
    files.atomic_write(output, text.encode(), 0o644)
