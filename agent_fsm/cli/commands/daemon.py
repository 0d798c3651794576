"""`agent-fsm daemon`, the agent unit's main process (Type=notify), and `start-check`, its
ExecStartPre=."""

from __future__ import annotations

import typer

from .. import options


def daemon(ctx: typer.Context) -> None:
    """Run as the agent unit's main process (Type=notify).

    It judges or converges, opens the gate, sends READY=1, supervises the workload and stops cleanly
    on SIGTERM. Every 5 s it finishes an install, activate or upgrade that died half-way, by
    restarting its unit.

    Example (in the unit): ExecStart=/var/lib/agent-fsm/selected/bin/agent-fsm daemon
    """
    from ..fast_path import run_daemon  # the code `agent-fsm daemon` runs without the full CLI

    raise typer.Exit(run_daemon(options.of(ctx)))


def start_check(ctx: typer.Context) -> None:
    """Run as the agent unit's ExecStartPre= (the last-good's binary): count a candidate's start.

    Once max_attempts starts are used up, it starts the recovery unit and exits 1, refusing the
    start. With no upgrade pending it exits 0.

    Example (in the unit): ExecStartPre=/var/lib/agent-fsm/last-good/bin/agent-fsm start-check
    """
    from ..fast_path import run_start_check  # the code the unit runs without the full CLI

    raise typer.Exit(run_start_check(options.of(ctx)))
