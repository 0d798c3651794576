"""How a run ends: the documented exit codes, and expected failures as one line and a code.

Kept free of typer and rich: the `status --json` fast path (entry.py) uses it as the full CLI does.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from ..errors import EXIT_ERROR, AgentFsmError

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it

EXIT_CODES = """\
Exit codes: 0 success; 1 error (one line on stderr says what and what to do); 2 usage;
3 refused (the gate is closed, an upgrade is pending, the command is not allowed in the current
state; a hold, an inhibitor, a known-bad version or a `before` hook, or a release that is
unsigned or built for another Python); 4 (`upgrade --wait`) the candidate was judged failed and
the node rolled back.
"""


def guarded(run: Callable[[], int | None]) -> int:
    """Run `run` and return its exit code; an expected failure becomes one line on stderr and
    its code (AgentFsmError its own, OSError 1), Ctrl-C a quiet 130. No traceback."""
    try:
        return run() or 0
    except AgentFsmError as exc:
        _say(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except OSError as exc:
        _say(exc)
        return EXIT_ERROR


def _say(exc: BaseException) -> None:
    sys.stderr.write(f"agent-fsm: {exc}\n")
    sys.stderr.flush()
