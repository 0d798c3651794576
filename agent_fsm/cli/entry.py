"""The console script's entry: lean paths for what systemd and fleet tools run, the rest through
the full CLI.

`[--config FILE] [--root DIR] daemon | recover | status --json` are served by lean.py before
typer is imported, with the same output, messages and exit codes as the full CLI (tests compare
the two); anything else goes to `app.main`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from . import lean


def _status_json_argv(argv: list[str]) -> tuple[Path | None, Path | None] | None:
    """(config, root) when argv is exactly a global-options + `status --json` call."""
    found = lean.parse(argv)
    if found is None or found[1] is not lean.run_status_json:
        return None
    return found[0].config, found[0].root


def main() -> None:
    code = lean.main(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    from .app import main as cli_main

    cli_main()
