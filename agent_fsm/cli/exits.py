"""How a run ends: the documented exit codes, and expected failures as one line and a code.

Kept free of typer and rich: the `status --json` fast path (entry.py) uses it as the full CLI does.
"""

from __future__ import annotations

import errno
import os
import shlex
import sys
from collections.abc import Callable, Sequence

from ..errors import EXIT_ERROR, AgentFsmError, NeedsRoot
from ..untrusted import MAX_LINE, shown

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it

EXIT_CODES = """\
Exit codes: 0 success; 1 error (one line on stderr says what and what to do); 2 usage;
3 refused (the gate is closed, an upgrade is pending, the recovery unit is still at work, the
command is not allowed in the current state; a hold, an inhibitor, a known-bad version or a
`before` hook, or a release that is unsigned or built for another Python); 4 (`upgrade --wait`)
the candidate was judged failed and the node rolled back.
"""


def guarded(run: Callable[[], int | None]) -> int:
    """Run `run` and return its exit code, never with a traceback.

    An expected failure becomes one line on stderr and its code (an AgentFsmError its own, OSError
    1); Ctrl-C a quiet 130. A process not run as root, denied what is root's, is told so
    (`needs_root`).
    """
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
    """The error as one line, cut to MAX_LINE. Messages quote paths, files and commands' words, so
    control characters, line breaks too, are shown visibly."""
    sys.stderr.write(f"agent-fsm: {shown(needs_root(exc, sys.argv[1:]) or exc, MAX_LINE)}\n")
    sys.stderr.flush()


def _denied(exc: BaseException) -> BaseException | None:
    """The permission error (or NeedsRoot) behind `exc`, following its causes and contexts."""
    seen: BaseException | None = exc
    for _ in range(10):  # a chain is short; never loop on a cycle
        if seen is None:
            return None
        if isinstance(seen, NeedsRoot) or (isinstance(seen, OSError)
                                            and seen.errno in (errno.EACCES, errno.EPERM)):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def needs_root(exc: BaseException, args: Sequence[str]) -> str | None:
    """"status needs root (…): run it as root (sudo agent-fsm status)" for a process not run as root
    that was denied something root's; else None (root, another user's file, no permission error)."""
    if os.geteuid() == 0:
        return None
    denied = _denied(exc)
    if denied is None:
        return None
    path = getattr(denied, "filename", None)
    if path is not None and _owner(os.fsdecode(path)) not in (0, None):
        return None  # another user's file: the message as it is says whose
    what = f"permission denied: {os.fsdecode(path)}" if path is not None else str(denied)
    return (f"{_command(args)} needs root ({what}): run it as root "
            f"(sudo agent-fsm {shlex.join(args)})")


def _owner(path: str) -> int | None:
    """The uid owning `path`, or its nearest parent this process can see; None if none."""
    here = path
    while here:
        try:
            return os.lstat(here).st_uid
        except OSError:
            parent = os.path.dirname(here)
            if parent == here:
                return None
            here = parent
    return None


def _command(args: Sequence[str]) -> str:
    """The command's words in `args` (`release add`, `status`), past the global options."""
    words, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in ("--config", "--root"):
            skip = True
        elif a.startswith("-"):
            continue
        else:
            words.append(a)
            if a != "release" or len(words) > 1:
                break
    return " ".join(words) or "agent-fsm"
