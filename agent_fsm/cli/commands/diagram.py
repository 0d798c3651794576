"""`agent-fsm diagram`: the machine drawn from its definition, and `--check` of a committed page
against it (a CI's). The lab writes the page: `make diagram`."""

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
    check: Annotated[bool, typer.Option(
        "--check", help="Print no diagram; compare the committed page DIR/agent-upgrade.md with "
        "what the definition renders: exit 0 when they are equal, 1 with one line naming the "
        "page and the command that rewrites it. --format, --output and --current are accepted "
        "and do not apply.")] = False,
    directory: Annotated[Path, typer.Option(
        "--dir", metavar="DIR", help="With --check: the directory holding the page. Relative to "
        "the current directory: a CI runs it from the checkout's root.")] = Path("diagrams"),
) -> None:
    """Print the machine as a diagram, generated from its definition in states/; or, with
    --check, say whether the committed page is what the definition renders (for a CI).

    Example: agent-fsm diagram --format svg --current --output machine.svg

    Example (a CI job, in the checkout's root): agent-fsm diagram --check
    """
    from ...upgrade.registry import load_definition

    d = diagram_mod.from_definition(load_definition())
    if check:
        page = diagram_mod.check_page(d, directory)
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
