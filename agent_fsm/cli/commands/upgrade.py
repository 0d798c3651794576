"""`agent-fsm upgrade`: start an upgrade, and with --wait follow it to its judgment."""

from __future__ import annotations

from typing import Annotated

import typer

from .. import options
from ..render import out


def upgrade(
    ctx: typer.Context,
    to: Annotated[str, typer.Option("--to", help="A stored release to upgrade to.")],
    wait: Annotated[bool, typer.Option(
        "--wait", help="Follow the upgrade to its end: exit 0 when converged, 4 when rolled "
        "back.")] = False,
    timeout: Annotated[float, typer.Option(
        "--timeout", help="With --wait: give up following after S seconds (exit 1).")] = 600.0,
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
