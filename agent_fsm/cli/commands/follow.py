"""`agent-fsm follow`: one look at the node's signed channel, and the judged upgrade it calls for."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from ...errors import EXIT_ERROR, EXIT_OK, EXIT_REFUSED, EXIT_ROLLED_BACK
from ...untrusted import MAX_LINE, shown
from .. import options, render
from ..render import out

_CODES = {"upgraded": EXIT_OK, "started": EXIT_OK, "up_to_date": EXIT_OK,
          "nothing_eligible": EXIT_OK, "held": EXIT_REFUSED, "rolled_back": EXIT_ROLLED_BACK,
          "refused": EXIT_ERROR, "failed": EXIT_ERROR}


def follow(
    ctx: typer.Context,
    no_wait: Annotated[bool, typer.Option(
        "--no-wait", help="Begin the upgrade and return, without following it to its "
        "judgment (the result is published as for any upgrade).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="The follow's record, as JSON.")] = False,
) -> None:
    """Look once at the channel `[channel]` names, as `<name>-follow.timer` does in its window.

    It checks the signed index and picks the newest version eligible here: not revoked or known bad,
    past its not-before time, its rollout covering this node's bucket. It fetches and adds it, and
    upgrades to it as `upgrade --wait` does. A hold, an inhibitor or a pending upgrade stops it
    before any fetch. An unreachable server, or a refused index or release, changes nothing. One
    line says what happened; `status` shows it too (docs/fleet.md).

    Exit codes: 0 upgraded, up to date or nothing eligible; 1 the server, the index or the release
    failed or was refused; 3 held (a hold, an inhibitor, a pending upgrade); 4 the version taken was
    judged failed and the node rolled back.

    Example: agent-fsm follow
    """
    from ...actions.follow import follow as do_follow

    rec = do_follow(options.of(ctx).node(), wait=not no_wait).record
    code = _CODES[rec.outcome.value]
    if as_json:
        render.print_json(rec.to_json())
    elif code in (EXIT_ERROR, EXIT_REFUSED):
        sys.stderr.write(f"agent-fsm: follow: {shown(rec.message, MAX_LINE)}\n")
    else:
        out.print(shown(rec.message, MAX_LINE), markup=False)
    raise typer.Exit(code)
