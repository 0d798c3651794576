"""`agent-fsm daemon`: the agent unit's main process (Type=notify)."""

from __future__ import annotations

import typer

from .. import options


def daemon(ctx: typer.Context) -> None:
    """Run as the agent unit's main process (Type=notify): judge or converge, open the gate,
    send READY=1, supervise the workload, stop cleanly on SIGTERM.

    Example (in the unit): ExecStart=/var/lib/agent-fsm/selected/bin/agent-fsm daemon
    """
    from ..fast_path import run_daemon  # the code `agent-fsm daemon` runs without the full CLI

    raise typer.Exit(run_daemon(options.of(ctx)))
