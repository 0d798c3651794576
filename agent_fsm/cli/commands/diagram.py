"""`agent-fsm diagram`: the machine drawn from its definition. The lab keeps the committed page
fresh: `python -m agent_fsm_lab diagram [--write]`."""

from __future__ import annotations

import enum
import sys
from pathlib import Path
from typing import Annotated

import typer

from ... import files
from ...views import diagram as diagram_mod
from .. import options
from ..render import err


class DiagramFormat(enum.StrEnum):
    mermaid = "mermaid"
    dot = "dot"
    svg = "svg"
    markdown = "markdown"


def diagram(
    ctx: typer.Context,
    fmt: Annotated[DiagramFormat, typer.Option(
        "--format", help="mermaid, dot, svg (rendered by graphviz's `dot`, which must be "
        "installed) or markdown (the committed page: diagram, states, transition table).")
    ] = DiagramFormat.mermaid,
    output: Annotated[Path | None, typer.Option(
        "--output", metavar="FILE", help="Write to FILE instead of stdout.",
        show_default=False)] = None,
    current: Annotated[bool, typer.Option(
        "--current", help="Highlight the node's current state (reads the state file).")] = False,
) -> None:
    """Print the machine as a diagram, generated from its definition in states/.

    Example: agent-fsm diagram --format svg --current --output machine.svg
    """
    from ...upgrade.registry import load_definition

    d = diagram_mod.from_definition(load_definition())
    highlight = options.of(ctx).node().store.read().state if current else None
    text = {
        DiagramFormat.mermaid: lambda: diagram_mod.mermaid(d, highlight),
        DiagramFormat.dot: lambda: diagram_mod.dot(d, highlight),
        DiagramFormat.svg: lambda: diagram_mod.svg(d, highlight),
        DiagramFormat.markdown: lambda: diagram_mod.markdown(d),
    }[fmt]()
    if output is not None:
        files.atomic_write(output, text.encode(), 0o644)
        err.print(f"wrote {output}", markup=False)
        return
    sys.stdout.write(text)
