"""`agent-fsm hold` and `agent-fsm unhold`: hold upgrades on this node, and lift the hold."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from ...errors import EXIT_USAGE
from ...untrusted import MAX_LINE, shown
from .. import options, render
from ..render import out


def hold(
    ctx: typer.Context,
    reason: Annotated[str, typer.Option(
        "--reason", metavar="TEXT", help="Why upgrades are held: shown to whoever is refused.")],
    until: Annotated[str | None, typer.Option(
        "--until", metavar="TIME", help="When the hold ends by itself: an ISO 8601 time "
        "(2026-12-01T18:00:00+01:00; UTC when it has no offset) or a duration from now (30m, 2h, "
        "1d, 1w, 1h30m). Default: until `agent-fsm unhold`.", show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object, for programs.")] = False,
) -> None:
    """Hold upgrades: `upgrade` is refused (exit 3) until the hold ends or is lifted, unless
    --force. A new hold replaces the old. Rollbacks, `install` and `activate` are never held.

    Example: agent-fsm hold --reason "quarter-end batch" --until 6h
    """
    from ...actions.holds import hold as do_hold
    from ...node.records.hold import check_reason, parse_until

    node = options.of(ctx).node()
    try:
        check_reason(reason)
        end = None if until is None else parse_until(until, node.clock.now())
    except ValueError as exc:
        sys.stderr.write(f"agent-fsm: hold: {shown(exc, MAX_LINE)}; nothing was changed\n")
        raise typer.Exit(EXIT_USAGE) from None
    done = do_hold(node, reason, end)
    if as_json:
        render.print_json(done.to_json())
        return
    out.print(done.message, markup=False)


def unhold(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object, for programs.")] = False,
) -> None:
    """Lift the hold on upgrades, an expired or damaged hold file too. Inhibitors belong to the
    workloads: each ends when its workload removes its file.

    Example: agent-fsm unhold
    """
    from ...actions.holds import unhold as do_unhold

    done = do_unhold(options.of(ctx).node())
    if as_json:
        render.print_json(done.to_json())
        return
    out.print(done.message, markup=False)
