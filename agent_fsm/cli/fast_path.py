"""The commands systemd, fleet tools and upgrade scripts run, without typer, pydantic or rich.

`daemon`, `start-check`, `recover`, `status --json` and `upgrade`: their argument shapes, and the
code the full CLI runs for them too. Building the typer app costs several times what they do, on the
path of every upgrade and rollback. Only the exact shapes `[--config FILE] [--root DIR] COMMAND [its
options]` are served. Anything else (help, a typo, a bad value, completion) returns None for the
full CLI, which owns usage errors.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from ..machine.vocabulary import Trigger
from ..untrusted import MAX_LINE, shown
from .exits import guarded
from .options import Globals

if TYPE_CHECKING:
    from ..actions.upgrade import Progress, Step

GLOBAL_OPTIONS = ("--config", "--root")


def run_daemon(opts: Globals) -> int:
    """`agent-fsm daemon`: the agent unit's main process; its exit code."""
    from ..agent.daemon import main as daemon_main
    from ..agent.runtime import setup_logging
    from ..errors import ConfigError
    from ..node.config_fallback import tell_fallback
    from ..upgrade.roles import Command
    from ..upgrade.way_back import on_the_way_back

    setup_logging()  # with journald's priorities from the first line: the config's warnings too
    node = opts.node(way_back=True, command=Command.daemon)
    if node.config.fallback is not None and not on_the_way_back(node):
        # The kept settings serve the way back only; elsewhere the daemon refuses a wrong live file,
        # as operator commands do.
        raise ConfigError(node.config.fallback.error)
    tell_fallback(node.config)
    return daemon_main(node)


def run_start_check(opts: Globals) -> int:
    """`agent-fsm start-check`, the agent unit's ExecStartPre=: count a candidate's start; exit 1
    refuses it once its starts are used up."""
    from ..agent.start_check import main as start_check_main

    return start_check_main(lambda: opts.reader(way_back=True))


def run_recover(opts: Globals) -> int:
    """`agent-fsm recover`: roll back when an upgrade is pending, and say what it did in one line.

    Exits 0 when rolled back or with nothing to roll back, else non-zero. So the recovery unit's
    `Restart=on-failure` tries again, after a growing wait, until it succeeds.
    """
    from ..actions.recover import run
    from ..upgrade.roles import Command

    tried = run(lambda: opts.node(way_back=True, command=Command.recover), opts.words(),
                _told)
    if tried.done is not None:
        _said(tried.done.message)
        return 0
    assert tried.failure is not None
    _hold_off(tried.failure, tried.retry_in)
    tried.hold_off()
    return tried.exit_code


def _said(message: str) -> None:
    sys.stdout.write(shown(message, MAX_LINE) + "\n")
    sys.stdout.flush()


def _told(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _hold_off(exc: Exception, delay: float) -> None:
    """The recovery unit's failed try: say why, and when it is tried again."""
    import traceback

    from ..errors import AgentFsmError

    expected = isinstance(exc, (AgentFsmError, OSError))
    sys.stderr.write(f"agent-fsm: {shown(exc, MAX_LINE)}\n" if expected
                     else "".join(traceback.format_exception(exc)))
    sys.stderr.write(f"agent-fsm: the rollback is not done; the recovery unit tries again in "
                     f"about {delay + 1:.0f}s\n")
    sys.stderr.flush()


def run_status_json(opts: Globals) -> int:
    """`agent-fsm status --json`: the node's status as JSON (the keys in docs/operations.md)."""
    from ..views.status.report import status

    data = status(opts.reader(), diff=False, prog=opts.prog()).to_json()
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")
    return 0


def say(line: str) -> None:
    sys.stdout.write(shown(line, MAX_LINE) + "\n")
    sys.stdout.flush()  # --wait reports each step as it happens


def run_upgrade(opts: Globals, to: str, wait: bool = False, timeout: float = 600.0,
                force: bool = False, show: Callable[[Progress], None] | None = None) -> int:
    """`agent-fsm upgrade --to V [--wait] [--timeout S]`: start an upgrade; with --wait follow it to
    its judgment.

    --wait exits 0 converged, 4 rolled back (the stderr line ends with the reason `status` shows).
    `show` gets where it is at each read; by default a timestamped line per phase on stdout.
    """
    from ..actions.upgrade import Progress, upgrade
    from ..errors import RolledBack
    from .progress import Lines

    lines = show or Lines(say)

    def tell(step: Step) -> None:
        if isinstance(step, Progress):
            lines(step)
        else:
            _step(step)

    done = upgrade(opts.node(), to, wait=wait, timeout=timeout, force=force, tell=tell)
    if done.outcome is None or done.outcome == "ok":
        if done.outcome == "ok":
            say(f"upgrade to {to} judged ok; converged on {to}")
        return 0
    why = f" — {done.reason_class.replace('_', ' ')}: {done.reason}" if done.reason else ""
    raise RolledBack(f"the candidate {to} was judged failed; the node rolled back to "
                     f"{done.from_version}{why}")


def _step(step: Step) -> None:
    """One step of `upgrade`, as it happens (a transition followed is said by its phase)."""
    from ..actions.upgrade import Began, Forced, Waiting

    if isinstance(step, Waiting):
        say(f"waiting for {step.unit} to finish ({step.state}): it is still at work for the last "
            f"upgrade (at most {step.limit:.0f}s; then the upgrade is refused, exit 3)")
    elif isinstance(step, Forced):
        say(f"--force: going past {step.what}")
    elif isinstance(step, Began):
        say(f"upgrade {step.from_version} → {step.to_version} started; the candidate is being "
            "judged")


def _options(argv: Sequence[str], valued: Sequence[str], flags: Sequence[str] = (), *,
             until_word: bool = False) -> tuple[dict[str, str], int] | None:
    """The options at the start of argv, and where they end; None for a shape the full CLI reads.

    Each appears at most once: a flag bare, a valued one as `--opt VALUE` or `--opt=VALUE`, the
    value non-empty and not like an option. `until_word`: they end at the first word that is no
    option. Else every word must be one.
    """
    given: dict[str, str] = {}
    i = 0
    while i < len(argv) and (argv[i].startswith("-") or not until_word):
        name, eq, value = argv[i].partition("=")
        if name in given:
            return None
        if name in flags and not eq:
            given[name] = ""
            i += 1
            continue
        if name not in valued:
            return None
        if not eq:
            if i + 1 >= len(argv):
                return None
            i += 1
            value = argv[i]
        if not value or value.startswith("-"):
            return None
        given[name] = value
        i += 1
    return given, i


def _upgrade(argv: Sequence[str]) -> Callable[[Globals], int] | None:
    """`upgrade` with `--to V` once, and at most once each `--wait`, `--force` and `--timeout S` (S
    finite, above 0). The full CLI says what is wrong with any other. `--wait` on a terminal is the
    full CLI's: rich draws its live line."""
    found = _options(argv, ("--to", "--timeout"), ("--wait", "--force"))
    if found is None:
        return None
    given = found[0]
    if "--to" not in given or ("--wait" in given and sys.stdout.isatty()):
        return None  # on a terminal, --wait draws a live line with rich: the full CLI's
    timeout = 600.0
    if "--timeout" in given:
        try:
            timeout = float(given["--timeout"])
        except ValueError:
            return None
        if not math.isfinite(timeout) or timeout <= 0:
            return None
    return partial(run_upgrade, to=given["--to"], wait="--wait" in given, timeout=timeout,
                   force="--force" in given)


COMMANDS: dict[tuple[str, ...], Callable[[Globals], int]] = {
    ("daemon",): run_daemon,
    ("start-check",): run_start_check,
    (Trigger.recover.value,): run_recover,  # the command is named for the trigger it fires
    ("status", "--json"): run_status_json,
}


def parse(argv: Sequence[str]) -> tuple[Globals, Callable[[Globals], int]] | None:
    """The global options and the command when argv is exactly one of the fast path's shapes, else
    None.

    Each global option appears at most once, as `--opt VALUE` or `--opt=VALUE`, the value non-empty
    and not like an option. Anything the full CLI might read otherwise is the full CLI's.
    """
    found = _options(argv, GLOBAL_OPTIONS, until_word=True)
    if found is None:
        return None
    opts, i = found
    command = (_upgrade(argv[i + 1:]) if argv[i:i + 1] == ["upgrade"]
               else COMMANDS.get(tuple(argv[i:])))
    if command is None:
        return None
    config, root = opts.get("--config"), opts.get("--root")
    return Globals(None if config is None else Path(config),
                   None if root is None else Path(root)), command


def _completing() -> bool:
    """Whether the shell asks for completions (click's `_PROG_COMPLETE`): the full CLI's job."""
    return any(k.startswith("_") and k.endswith("_COMPLETE") for k in os.environ)


def main(argv: Sequence[str]) -> int | None:
    """Run a fast-path command and return its exit code; None when argv is not one (the full CLI's)."""
    if _completing():
        return None
    found = parse(argv)
    if found is None:
        return None
    opts, command = found
    return guarded(lambda: command(opts))
