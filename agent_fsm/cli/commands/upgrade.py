"""`agent-fsm upgrade`: start an upgrade, and with --wait follow it to its judgment."""

from __future__ import annotations

import math
import sys
from typing import Annotated

import typer

from ...errors import EXIT_USAGE
from .. import options
from ..render import out


def _seconds(value: float) -> float:
    """--timeout is checked before anything starts: a finite number of seconds above 0, else a
    usage error (exit 2) in one line."""
    if not math.isfinite(value) or value <= 0:
        sys.stderr.write(f"agent-fsm: upgrade: --timeout {value!r} is not a finite number of "
                         "seconds above 0; nothing was started\n")
        raise typer.Exit(EXIT_USAGE)
    return value


def upgrade(
    ctx: typer.Context,
    to: Annotated[str, typer.Option("--to", help="A stored release to upgrade to.")],
    wait: Annotated[bool, typer.Option(
        "--wait", help="Follow the upgrade to its end: exit 0 when converged, 4 when rolled "
        "back.")] = False,
    timeout: Annotated[float, typer.Option(
        "--timeout", callback=_seconds, help="With --wait: give up following after S seconds "
        "(exit 1). A finite number above 0, else a usage error (exit 2) and nothing starts.")
    ] = 600.0,
) -> None:
    """Upgrade to a release: write the signal, select it, reset the start limit, restart.

    Refused (exit 3) while the startup gate is closed or another upgrade is pending.

    Example: agent-fsm upgrade --to 2.0.0 --wait --timeout 300
    """
    from ...actions.operations import begin_upgrade, follow
    from ...errors import RolledBack

    node = options.of(ctx).node()
    doc = begin_upgrade(node, to)
    up = doc.upgrade
    assert up is not None
    out.print(f"upgrade {up.from_version} → {up.to_version} started; the candidate is "
              "being judged", markup=False)
    if not wait:
        return
    t0 = up.started

    def show(when: float, trigger: str, state: str) -> None:
        out.print(f"  +{when - t0:6.1f}s  {trigger:<18} → {state}", markup=False)

    result = follow(node, up.started, to, timeout, on_state=show)
    if result.outcome == "ok":
        out.print(f"upgrade to {to} judged ok; converged on {to}", markup=False)
        return
    raise RolledBack(f"the candidate {to} was judged failed; the node rolled back to "
                     f"{up.from_version}")
