"""The lab's command line: `python -m agent_fsm_lab try` (your releases on a throwaway node),
`demo` (what `make demo` runs) and `diagram [--write]` (the committed diagram page kept fresh:
`make lint`, `make diagram`).

Apart from agent-fsm's own CLI: a packed release carries only agent_fsm/, and nothing it runs
as root can load the lab.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from agent_fsm.cli.exits import guarded
from agent_fsm.cli.render import err, out

app = typer.Typer(name="agent-fsm-lab", add_completion=False, no_args_is_help=True,
                  help="agent-fsm's lab: your releases on a throwaway node, the demo, the diagram page.")


def _timeline(timeline: list[dict[str, Any]]) -> None:
    t0 = timeline[0]["time"] if timeline else 0.0
    table = Table(title="timeline")
    for col in ("t", "trigger", "from → to", "versions", "reason"):
        table.add_column(col)
    for e in timeline:
        up = e.get("upgrade")
        versions = f"{up['from']} → {up['to']}" if up else (e.get("release") or "")
        table.add_row(f"+{e['time'] - t0:.1f}s", e["trigger"], f"{e['from']} → {e['to']}",
                      versions, e.get("reason") or "")
    out.print(table)


@app.command("try")
def try_releases(
    releases: Annotated[list[Path], typer.Argument(
        metavar="RELEASE...", help="Release directories (`release pack`'s) or archives of "
        "them, in the order to install and upgrade through.", show_default=False)],
    config: Annotated[Path | None, typer.Option(
        "--config", metavar="FILE", help="Your node's config (its judgment, workload, checks); "
        "the lab places the node (name, directories, python). Default: the lab's.",
        show_default=False)] = None,
    systemd: Annotated[str, typer.Option(
        "--systemd", help="252: the host's systemd; 257: the Debian 13 node's tree "
        "(`make node257` caches it).")] = "252",
) -> None:
    """Try your releases on a throwaway node: boot a private systemd, install the first release
    with your config, upgrade through the others in order (each verdict and its reason), prove
    the way back (an upgrade whose every start is killed is rolled back), print the timeline,
    and remove everything.

    Needs root, util-linux unshare/nsenter and systemd. Exit 0 when every step ran (a release
    rolled back is a verdict, not a failure), 1 when the node could not be driven.

    Example: sudo .venv/bin/python -m agent_fsm_lab try --config node.toml ./rel-1.0.0 ./rel-1.1.0
    """
    from .trying import run as run_try

    if systemd not in ("252", "257"):
        raise typer.BadParameter("252 or 257", param_hint="--systemd")
    tried = run_try(releases, config, systemd,
                    lambda line: out.print(line, markup=False, highlight=False))
    _timeline(tried.timeline)
    st = tried.status
    out.print(f"final: {st['state']}, selected {st['selected']}, last-good {st['last_good']}; "
              "the node is shut down and its directory removed", markup=False)


@app.command()
def demo() -> None:
    """Show the whole story in a private systemd: install 1.0.0, upgrade to a good 2.0.0, then
    to a 3.0.0 that crashes at start with broken assets, and watch it roll back.

    Needs root, util-linux unshare/nsenter and systemd; touches nothing of the host outside its
    own directory under /var/lib/agent-fsm-e2e.

    Example: sudo make demo
    """
    from .demo import run as run_demo

    result = run_demo(lambda line: out.print(line, markup=False, highlight=False))
    _timeline(result.timeline)
    st = result.status
    sig, last = st["signal"], st["last_result"]
    out.print(f"final: {st['state']}, selected {st['selected']}, last-good {st['last_good']}, "
              f"gate {st['gate']}, signal "
              + (f"{sig['from']} → {sig['to']}" if sig else "none (no upgrade pending)")
              + ", last result " + (f"{last['to']} {last['outcome'].replace('_', ' ')}"
                                    if last else "none"), markup=False)


@app.command()
def diagram(
    write: Annotated[bool, typer.Option(
        "--write", help="Regenerate the page instead of checking it.")] = False,
    directory: Annotated[Path, typer.Option(
        "--dir", help="Where the committed diagram page lives.")] = Path("diagrams"),
) -> None:
    """Check that the committed diagram page matches the machine's definition (exit 1 when it
    is stale or missing), or regenerate it with --write.

    Example: python -m agent_fsm_lab diagram --write
    """
    from agent_fsm.upgrade.registry import load_definition
    from agent_fsm.views import diagram as diagram_mod

    page = directory / diagram_mod.DIAGRAM_FILE
    drawn = diagram_mod.from_definition(load_definition())
    if write:
        directory.mkdir(parents=True, exist_ok=True)
        page.write_text(diagram_mod.markdown(drawn), encoding="utf-8")
        err.print(f"wrote {page}", markup=False)
        return
    diagram_mod.check_page(drawn, directory)  # `agent-fsm diagram --check`'s
    err.print(f"{page} matches the machine definition", markup=False)


@app.callback()
def _lab() -> None:
    """agent-fsm's lab: the demo and the committed diagram page."""


def main() -> None:
    sys.exit(guarded(lambda: app(prog_name="python -m agent_fsm_lab")))
