"""`agent-fsm upgrade`: start an upgrade, and with --wait follow it to its judgment."""

from __future__ import annotations

import math
import sys
from typing import Annotated

import typer

from ...errors import EXIT_USAGE
from .. import options


def _seconds(value: float) -> float:
    """--timeout must be a finite number of seconds above 0, else a one-line usage error (exit 2)
    before anything starts."""
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
        "back. Where it is goes to stdout: one timestamped line a phase when piped, a live line "
        "on a terminal. Rolled back, the one line on stderr ends with the reason, as `status` "
        "has it.")] = False,
    timeout: Annotated[float, typer.Option(
        "--timeout", callback=_seconds, help="With --wait: give up following after S seconds "
        "(exit 1). A finite number above 0, else a usage error (exit 2) and nothing starts.")
    ] = 600.0,
    force: Annotated[bool, typer.Option(
        "--force", help="Go past a hold (`agent-fsm hold`), the workloads' inhibitors and a "
        "known-bad mark (the version rolled back here), for this upgrade only; each one "
        "overridden is named.")] = False,
) -> None:
    """Upgrade to a release: write the signal, select it, reset the start limit, restart.

    Refused (exit 3) while the gate is closed or another upgrade is pending. Unless --force, also
    refused while upgrades are held, a workload's inhibitor exists, or the version rolled back here
    (known bad; `status` lists them). A recovery unit still at work is waited for first (45 s at
    most, then exit 3, even with --force): its next try would roll this upgrade back.

    Example: agent-fsm upgrade --to 2.0.0 --wait --timeout 300
    """
    from ..fast_path import run_upgrade  # the code `agent-fsm upgrade` runs without the full CLI
    from ..render import out

    if not (wait and out.is_terminal):
        raise typer.Exit(run_upgrade(options.of(ctx), to, wait, timeout, force))
    from ..live_line import LiveLine

    with LiveLine() as line:
        code = run_upgrade(options.of(ctx), to, wait, timeout, force, show=line)
    raise typer.Exit(code)
