"""`agent-fsm status`: what is happening on this node and what you may do next."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from .. import options, render, status_view

if TYPE_CHECKING:
    from ...views.status.report import Status


def status(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object, for programs "
                                          "(with --watch: one object per line).")] = False,
    diff: Annotated[bool, typer.Option(
        "--diff", help="Show how each asset on disk differs from what the selected release "
        "would write (a unified diff).")] = False,
    watch: Annotated[bool, typer.Option(
        "--watch", help="Refresh until interrupted (Ctrl-C).")] = False,
    interval: Annotated[float | None, typer.Option(
        "--interval", min=0.1, metavar="S", help="With --watch: seconds between refreshes (default 2).",
        show_default=False)] = None,
    count: Annotated[int | None, typer.Option(
        "--count", min=1, metavar="N", help="With --watch: stop after N refreshes.",
        show_default=False)] = None,
) -> None:
    """Show what is happening on this node and what you may do next.

    The state and its meaning, the releases, the signal (age, attempt, deadline), the gate, the held
    assets, the last result, and the next action as a command to run.

    Example: agent-fsm status --watch --interval 1
    """
    from ...views.status.report import status as get_status

    opts = options.of(ctx)
    node = opts.reader()  # the same reader `status --json` uses without the full CLI

    def read() -> Status:
        return get_status(node, diff=diff, prog=opts.prog())

    if watch:
        status_view.watch(read, lambda st: status_view.status_view(st, diff), as_json,
                          2.0 if interval is None else interval, count)
        return
    if interval is not None or count is not None:
        raise typer.BadParameter("only with --watch", param_hint="--interval/--count")
    st = read()
    if as_json:
        render.print_json(st.to_json())
        return
    render.show(status_view.status_view(st, diff))
