"""The command line: the typer app, its global options (`ctx.obj`), its commands, and `main`.

Only this layer prints. Each command (commands/, one module each) calls down and renders the result
with render.py, for people or as JSON. An expected failure (an AgentFsmError) becomes one line on
stderr and a documented exit code (exits.py), never a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from .. import __version__
from ..node.config import keys_text
from .commands import (
    activate,
    channel,
    daemon,
    diagram,
    doctor,
    follow,
    history,
    hold,
    install,
    metrics,
    recover,
    release,
    status,
    upgrade,
)
from .exits import EXIT_CODES, guarded
from .options import Globals

app = typer.Typer(
    name="agent-fsm",
    help="Upgrade a systemd node agent through a declared, crash-safe state machine.\n\n"
    "Shell completion: `agent-fsm --install-completion` (or `--show-completion` to see it).\n\n"
    + EXIT_CODES,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        print(f"agent-fsm {__version__}{_release()}")
        raise typer.Exit()


def _release() -> str:
    """` (release V)` when this agent_fsm runs from a packed release's lib/, else empty."""
    import tomllib

    lib = Path(__file__).resolve().parents[2]
    if lib.name != "lib":
        return ""
    try:
        version = tomllib.loads((lib.parent / "release.toml").read_text())["version"]
    except (OSError, ValueError, KeyError):
        return ""
    return f" (release {version})" if isinstance(version, str) else ""


@app.callback()
def main_options(
    ctx: typer.Context,
    config: Annotated[Path | None, typer.Option(
        "--config", metavar="FILE", help="Config file (TOML). Default: $AGENT_FSM_CONFIG, then "
        f"/etc/agent-fsm/config.toml. Its keys: {keys_text()} (docs/configuration.md).",
        show_default=False)] = None,
    root: Annotated[Path | None, typer.Option(
        "--root", metavar="DIR", help="Write everything below DIR; unit contents keep host paths.",
        show_default=False)] = None,
    version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Print the version and exit.")] = False,
) -> None:
    ctx.obj = Globals(config, root)


for _command in (status.status, history.history, diagram.diagram, metrics.metrics,
                 doctor.doctor, install.install, activate.activate, upgrade.upgrade,
                 hold.hold, hold.unhold, recover.recover, daemon.daemon, daemon.start_check,
                 follow.follow):
    app.command(epilog=EXIT_CODES)(_command)


app.add_typer(release.app, name="release")
app.add_typer(channel.app, name="channel")


def main() -> None:
    """The console script: run the app, turning expected failures into one line and a code.

    Usage lines say `agent-fsm` however it was started; click would say `python -m agent_fsm` for a
    release's launcher.
    """
    sys.exit(guarded(lambda: app(prog_name="agent-fsm")))
