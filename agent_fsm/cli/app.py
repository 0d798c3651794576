"""The command line: the typer app, its global options (`ctx.obj`), its commands, and `main`.

Nothing below this layer prints. Each command (commands/, one module each) calls down and renders
the result with render.py, for people or as JSON; expected failures (every AgentFsmError) become
one line on stderr and a documented exit code (exits.py), never a traceback. Commands declared in
the entry point group `agent_fsm.commands` are added after the built-in ones (the lab's `demo`).
"""

from __future__ import annotations

import sys
from importlib.metadata import entry_points
from importlib.util import find_spec
from pathlib import Path
from typing import Annotated

import typer

from .. import __version__
from ..node.config import keys_text
from .commands import (
    activate,
    daemon,
    diagram,
    doctor,
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

PLUGIN_GROUP = "agent_fsm.commands"

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
                 hold.hold, hold.unhold, recover.recover, daemon.daemon, daemon.start_check):
    app.command(epilog=EXIT_CODES)(_command)


def _beside_us(module: str) -> bool:
    """Whether `module` is installed beside this agent_fsm (the same directory of sys.path).

    Not so for a packed release: it carries only agent_fsm/ and runs with the interpreter that
    packed it, which may well see the project installed; those commands are not the release's.
    """
    spec = find_spec(module.partition(".")[0])
    if spec is None or spec.origin is None:
        return False
    where = Path(spec.origin).resolve().parent
    if spec.submodule_search_locations is not None:  # a package: origin is its __init__.py
        where = where.parent
    return where == Path(__file__).resolve().parents[2]


def _add_plugins() -> None:
    """Add the commands declared in the entry point group `agent_fsm.commands` by packages
    installed beside this agent_fsm. One that does not load is left out, so that the built-in
    commands always work; none replaces a built-in command."""
    taken = {c.name or (c.callback.__name__ if c.callback else "") for c in app.registered_commands}
    taken |= {g.name for g in app.registered_groups if g.name}
    for ep in entry_points(group=PLUGIN_GROUP):
        if ep.name in taken or not _beside_us(ep.module):
            continue
        try:
            command = ep.load()
        except Exception:  # any failure of another package's import: leave its command out
            continue
        app.command(ep.name, epilog=EXIT_CODES)(command)
        taken.add(ep.name)


app.add_typer(release.app, name="release")
_add_plugins()


def main() -> None:
    """The console script: run the app, turning expected failures into one line and a code.
    Named `agent-fsm` in usage lines however it was started (click would say `python -m
    agent_fsm` for a release's launcher, which runs the package as `__main__`)."""
    sys.exit(guarded(lambda: app(prog_name="agent-fsm")))
