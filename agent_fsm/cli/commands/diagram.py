"""`agent-fsm diagram`: the machine drawn from its definition, and the committed page kept fresh."""

from __future__ import annotations

import enum
import sys
from pathlib import Path
from typing import Annotated

import typer

from ... import files
from ...errors import AgentFsmError
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
    check: Annotated[bool, typer.Option(
        "--check", help="Exit 1 if the committed page under --dir is stale.")] = False,
    write: Annotated[bool, typer.Option(
        "--write", help="Regenerate the committed page under --dir.")] = False,
    directory: Annotated[Path, typer.Option(
        "--dir", help="Where the committed diagram page lives.")] = Path("diagrams"),
) -> None:
    """Print the machine as a diagram, generated from its definition in states/.

    Example: agent-fsm diagram --format svg --current --output machine.svg
    """
    from ...upgrade.registry import load_definition

    d = diagram_mod.from_definition(load_definition())
    page = directory / diagram_mod.DIAGRAM_FILE
    if check or write:
        expected = diagram_mod.markdown(d)
        if write:
            directory.mkdir(parents=True, exist_ok=True)
            page.write_text(expected, encoding="utf-8")
            err.print(f"wrote {page}", markup=False)
            return
        try:
            actual = page.read_text(encoding="utf-8")
        except FileNotFoundError:
            actual = None
        if actual != expected:
            raise AgentFsmError(
                f"{page} is stale or missing: it does not match the machine definition; "
                "run `agent-fsm diagram --write` and commit the result"
            )
        err.print(f"{page} matches the machine definition", markup=False)
        return
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
