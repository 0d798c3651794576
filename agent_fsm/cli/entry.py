"""The console script's entry: the fast path for what systemd and fleet tools run, the rest through
the full CLI.

fast_path.py serves `[--config FILE] [--root DIR] daemon | recover | status --json` before typer is
imported. Output, messages and exit codes are the full CLI's; tests compare the two. Anything else
goes to `app.main`.
"""

from __future__ import annotations

import sys

from . import fast_path


def main() -> None:
    code = fast_path.main(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    from .app import main as cli_main

    cli_main()
