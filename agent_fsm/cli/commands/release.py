"""`agent-fsm release pack|add|list|prune`: make, store, list and prune releases."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from .. import options, render
from ..exits import EXIT_CODES
from ..render import out

app = typer.Typer(
    help="Make, add, list and prune releases.\n\nExample: agent-fsm release list --json",
    no_args_is_help=True, epilog=EXIT_CODES)


@app.command("pack", epilog=EXIT_CODES)
def release_pack(
    version: Annotated[str, typer.Option("--version", help="The release's version.")],
    output: Annotated[Path, typer.Option("--output", help="The release directory to create.")],
    workload: Annotated[str | None, typer.Option(
        "--workload", help="A command (shell words) the daemon supervises once the gate opens.",
        show_default=False)] = None,
) -> None:
    """Make a release directory from this agent-fsm: release.toml, bin/agent-fsm, assets/.

    Example: agent-fsm release pack --version 2.0.0 --output ./agent-fsm-2.0.0
    """
    from ...actions.packing import pack

    path = pack(version, output, tuple(shlex.split(workload)) if workload else ())
    out.print(f"packed release {version} in {path}", markup=False)


@app.command("add", epilog=EXIT_CODES)
def release_add(
    ctx: typer.Context,
    directory: Annotated[Path, typer.Argument(help="A release directory (from `release pack`).")],
) -> None:
    """Validate a release directory and store it on this host.

    Example: agent-fsm release add ./agent-fsm-2.0.0
    """
    from ...actions.packing import add

    added = add(directory, options.of(ctx).node())
    verb = "already stored at" if added.already else "stored at"
    out.print(f"release {added.version} {verb} {added.path}", markup=False)


@app.command("list", epilog=EXIT_CODES)
def release_list(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="A JSON list.")] = False,
) -> None:
    """List the stored releases, marking the selected and the last-good.

    Example: agent-fsm release list --json
    """
    releases = options.of(ctx).node().host.releases
    selected, last_good = releases.selected(), releases.last_good()
    rows = [{"version": v, "selected": v == selected, "last_good": v == last_good}
            for v in releases.versions()]
    if as_json:
        render.print_json(rows)
        return
    for r in rows:
        marks = [m for m, on in (("selected", r["selected"]), ("last-good", r["last_good"])) if on]
        out.print(f"{r['version']}" + (f"  ({', '.join(marks)})" if marks else ""), markup=False)


@app.command("prune", epilog=EXIT_CODES)
def release_prune(ctx: typer.Context) -> None:
    """Remove stored releases other than the selected, the last-good and a pending upgrade's.

    Example: agent-fsm release prune
    """
    from ...actions.packing import prune

    removed = prune(options.of(ctx).node())
    out.print(f"removed {', '.join(removed)}" if removed else "nothing to prune", markup=False)
