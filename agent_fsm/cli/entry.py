"""The console script's entry: a fast path for `status --json`, the rest through the full CLI.

Fleet tools poll `agent-fsm status --json`; building the typer app (typer, its pydantic
adapters, rich) costs several times what the status itself does. So the exact argument shapes
`[--config FILE] [--root DIR] status --json` are served here, with the same output, messages
and exit codes as the full CLI (a test compares the two); anything else goes to `app.main`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .exits import guarded
from .options import Globals


def _status_json_argv(argv: list[str]) -> tuple[Path | None, Path | None] | None:
    """(config, root) when argv is exactly a global-options + `status --json` call."""
    opts: dict[str, Path] = {}
    i = 0
    while i < len(argv) and argv[i] not in ("status",):
        word = argv[i]
        name, eq, value = word.partition("=")
        if name not in ("--config", "--root") or name in opts:
            return None
        if not eq:
            if i + 1 >= len(argv):
                return None
            i += 1
            value = argv[i]
        if not value or value.startswith("-"):
            return None
        opts[name] = Path(value)
        i += 1
    if argv[i:] != ["status", "--json"]:
        return None
    return opts.get("--config"), opts.get("--root")


def _status_json(opts: Globals) -> None:
    from ..views.status import status

    data = status(opts.node(), diff=False, prog=opts.prog()).to_json()
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def main() -> None:
    fast = _status_json_argv(sys.argv[1:])
    if fast is not None:
        sys.exit(guarded(lambda: _status_json(Globals(*fast))))
    from .app import main as cli_main

    cli_main()
