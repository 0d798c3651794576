"""`agent-fsm doctor`: check the host and say what to do about each finding."""

from __future__ import annotations

from typing import Annotated

import typer

from ...errors import EXIT_ERROR
from .. import options, render


def doctor(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="A JSON list of findings.")] = False,
) -> None:
    """Check the host and say what to do about each finding: systemd's version, the rendered
    units, directory ownership and modes, the lock's filesystem, the state file, the signal and
    the gate against the state, the assets, the selected and last-good releases against their
    digests, and what the units say now (a failed agent or recovery unit, a rollback systemd
    retries, a state dir that cannot be written). Exits 1 when any check fails: a damaged
    selected release (the agent cannot start it) is one.

    Example: agent-fsm doctor --json
    """
    from ...views.doctor.checks import doctor as run_doctor

    opts = options.of(ctx)
    findings = run_doctor(opts.node(), prog=opts.prog())
    failed = any(f.level == "fail" for f in findings)
    if as_json:
        render.print_json([f.to_json() for f in findings])
    else:
        render.show_doctor(findings)
    if failed:
        raise typer.Exit(EXIT_ERROR)
