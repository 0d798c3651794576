"""The lab's command line: `python -m agent_fsm_lab demo` (what `make demo` runs).

Apart from agent-fsm's own CLI: a packed release carries only agent_fsm/, and nothing it runs
as root can load the lab.
"""

from __future__ import annotations

import sys

import typer
from rich.table import Table

from agent_fsm.cli.exits import guarded
from agent_fsm.cli.render import out

app = typer.Typer(name="agent-fsm-lab", add_completion=False, no_args_is_help=True,
                  help="agent-fsm's lab: a node under a private systemd, for the demo.")


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
    t0 = result.timeline[0]["time"] if result.timeline else 0.0
    table = Table(title="timeline")
    for col in ("t", "trigger", "from → to", "versions"):
        table.add_column(col)
    for e in result.timeline:
        up = e.get("upgrade")
        versions = f"{up['from']} → {up['to']}" if up else (e.get("release") or "")
        table.add_row(f"+{e['time'] - t0:.1f}s", e["trigger"], f"{e['from']} → {e['to']}",
                      versions)
    out.print(table)
    st = result.status
    sig, last = st["signal"], st["last_result"]
    out.print(f"final: {st['state']}, selected {st['selected']}, last-good {st['last_good']}, "
              f"gate {st['gate']}, signal "
              + (f"{sig['from']} → {sig['to']}" if sig else "none (no upgrade pending)")
              + ", last result " + (f"{last['to']} {last['outcome'].replace('_', ' ')}"
                                    if last else "none"), markup=False)


@app.callback()
def _lab() -> None:
    """agent-fsm's lab: a node under a private systemd, for the demo."""


def main() -> None:
    sys.exit(guarded(lambda: app(prog_name="python -m agent_fsm_lab")))
