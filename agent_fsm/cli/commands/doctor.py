"""`agent-fsm doctor`: check the host and say what to do about each finding."""

from __future__ import annotations

import contextlib
from typing import Annotated

import typer

from ...errors import EXIT_ERROR, ConfigError
from .. import options, render


def doctor(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="A JSON list of findings.")] = False,
) -> None:
    """Check the host and say what to do about each finding.

    Checked: systemd's version, the rendered units, directory owners and modes, the lock's
    filesystem, the state file, the signal and the gate against the state, the assets, the selected
    and last-good releases against their digests, and what the units say now. A config agent-fsm
    refuses (a typo in a key, a value out of range) is a finding naming its line; the other checks
    then run with the config as the daemon reads it. Exits 1 when any check fails.

    Example: agent-fsm doctor --json
    """
    from ...views.doctor.checks import doctor as run_doctor
    from ...views.doctor.config_refused import config_refused

    opts = options.of(ctx)
    try:
        findings = run_doctor(opts.node(), prog=opts.prog())
    except ConfigError as exc:
        from ...node.config import source_of
        from ...node.config_fallback import way_back_config
        from ...wiring import open_node

        findings = [config_refused(source_of(opts.config, opts.root)[0], exc)]
        with contextlib.suppress(ConfigError):  # wrong for the daemon too: that finding alone
            config = way_back_config(opts.config, opts.root, quiet=True)
            findings += run_doctor(open_node(config, opts.root), prog=opts.prog())
    failed = any(f.level == "fail" for f in findings)
    if as_json:
        render.print_json([f.to_json() for f in findings])
    else:
        render.show_doctor(findings)
    if failed:
        raise typer.Exit(EXIT_ERROR)
