"""The command line: parses options, calls the commands, renders their results, owns exit codes.

Nothing below this layer prints. Expected failures (every AgentFsmError) become one line on
stderr and a documented exit code, never a traceback.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from . import __version__
from . import config as config_mod
from . import diagram as diagram_mod
from .errors import EXIT_ERROR, AgentFsmError
from .node import Node, open_node

EXIT_CODES = """\
Exit codes: 0 success; 1 error (one line on stderr says what and what to do); 2 usage;
3 refused (the gate is closed, an upgrade is pending, or the command is not allowed in the
current state); 4 (`upgrade --wait`) the candidate was judged failed and the node rolled back.
"""

app = typer.Typer(
    name="agent-fsm",
    help="Upgrade a systemd node agent through a declared, crash-safe state machine.\n\n"
    + EXIT_CODES,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
    rich_markup_mode=None,
)

out = Console()
err = Console(stderr=True)


class Options:
    config: Path | None = None
    root: Path | None = None


_opts = Options()


def _version(value: bool) -> None:
    if value:
        print(f"agent-fsm {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    config: Annotated[Path | None, typer.Option(
        "--config", help="Config file (TOML). Default: $AGENT_FSM_CONFIG, then "
        "/etc/agent-fsm/config.toml.", show_default=False)] = None,
    root: Annotated[Path | None, typer.Option(
        "--root", help="Write everything below DIR; unit contents keep host paths.",
        show_default=False)] = None,
    version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Print the version and exit.")] = False,
) -> None:
    _opts.config = config
    _opts.root = root


def _node() -> Node:
    return open_node(config_mod.load(_opts.config), _opts.root)


def _json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=False))


def _when(ts: float | None) -> str:
    if ts is None:
        return "—"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


# Inspection ---------------------------------------------------------------------------------
@app.command()
def status(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object, for programs.")] = False,
) -> None:
    """Show the state of the upgrade machine, the releases, the signal and the gate.

    Example: agent-fsm --config /etc/agent-fsm/config.toml status --json
    """
    from .status import status as get_status

    st = get_status(_node())
    if as_json:
        _json(st.to_json())
        return
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row("state", f"{st.state} — {st.meaning}")
    table.add_row("now", st.situation)
    table.add_row("selected", st.selected or "—")
    table.add_row("last-good", st.last_good or "—")
    if st.signal:
        s = st.signal
        table.add_row("signal", f"upgrade {s['from']} → {s['to']}, attempt {s['attempt']}, "
                      f"deadline {_when(s['deadline'])}")
    else:
        table.add_row("signal", "none (no upgrade pending)")
    table.add_row("gate", st.gate)
    table.add_row("held assets", "\n".join(st.held_assets) or "none")
    if st.last_result:
        r = st.last_result
        table.add_row("last result", f"{r['from']} → {r['to']}: {r['outcome']} at {_when(r['time'])}")
    if st.owed:
        table.add_row("owed", f"{st.owed['trigger']}: {', '.join(st.owed['effects'])} "
                      "(resumed by the next start)")
    table.add_row("allowed", ", ".join(st.allowed) or "none")
    out.print(table)


@app.command()
def history(
    as_json: Annotated[bool, typer.Option("--json", help="A JSON list, oldest first.")] = False,
    limit: Annotated[int, typer.Option("--limit", min=1, help="Show the last N transitions.")] = 50,
) -> None:
    """Show the transitions the machine went through, oldest first.

    Example: agent-fsm history --limit 10
    """
    node = _node()
    entries = node.store.read().history[-limit:]
    if as_json:
        _json(entries)
        return
    table = Table(title="history")
    for col in ("time", "trigger", "from → to", "release"):
        table.add_column(col)
    for e in entries:
        up = e.get("upgrade")
        release = f"{up['from']} → {up['to']}" if up else (e.get("release") or "")
        table.add_row(_when(e["time"]), e["trigger"], f"{e['from']} → {e['to']}", release)
    out.print(table)


@app.command()
def diagram(
    fmt: Annotated[str, typer.Option("--format", help="mermaid, dot or markdown.")] = "mermaid",
    check: Annotated[bool, typer.Option(
        "--check", help="Exit 1 if the committed page under --dir is stale.")] = False,
    write: Annotated[bool, typer.Option(
        "--write", help="Regenerate the committed page under --dir.")] = False,
    directory: Annotated[Path, typer.Option(
        "--dir", help="Where the committed diagram page lives.")] = Path("diagrams"),
    current: Annotated[bool, typer.Option(
        "--current", help="Highlight the node's current state (reads the state file).")] = False,
) -> None:
    """Print the machine as a diagram, generated from its definition in states/.

    Example: agent-fsm diagram --format dot | dot -Tsvg > machine.svg
    """
    from .machine import load_definition

    d = diagram_mod.from_definition(load_definition())
    page = directory / diagram_mod.DIAGRAM_FILE
    if check or write:
        expected = diagram_mod.markdown(d)
        if write:
            directory.mkdir(parents=True, exist_ok=True)
            page.write_text(expected, encoding="utf-8")
            err.print(f"wrote {page}")
            return
        try:
            actual = page.read_text(encoding="utf-8")
        except FileNotFoundError:
            actual = None
        if actual != expected:
            raise AgentFsmError(
                f"{page} is stale or missing: it does not match the machine definition; "
                "run `agent-fsm diagram --write` and commit the result"
            )
        err.print(f"{page} matches the machine definition")
        return
    highlight = _node().store.read().state if current else None
    if fmt == "mermaid":
        sys.stdout.write(diagram_mod.mermaid(d, highlight))
    elif fmt == "dot":
        sys.stdout.write(diagram_mod.dot(d, highlight))
    elif fmt == "markdown":
        sys.stdout.write(diagram_mod.markdown(d))
    else:
        raise typer.BadParameter(f"{fmt!r}; use mermaid, dot or markdown", param_hint="--format")


# Operations ---------------------------------------------------------------------------------
release_app = typer.Typer(help="Make, add, list and prune releases.", no_args_is_help=True)
app.add_typer(release_app, name="release")


@release_app.command("pack")
def release_pack(
    version: Annotated[str, typer.Option("--version", help="The release's version.")],
    output: Annotated[Path, typer.Option("--output", help="The release directory to create.")],
    workload: Annotated[str | None, typer.Option(
        "--workload", help="A command (shell words) the daemon supervises once the gate opens.",
        show_default=False)] = None,
) -> None:
    """Make a release directory from this agent-fsm: release.toml, bin/agent-fsm, assets/.

    Example: agent-fsm release pack --version 2.0.0 --output ./agent-fsm-2.0.0
    """
    import shlex

    from .packing import pack

    path = pack(version, output, tuple(shlex.split(workload)) if workload else ())
    out.print(f"packed release {version} in {path}", markup=False)


@release_app.command("add")
def release_add(
    directory: Annotated[Path, typer.Argument(help="A release directory (from `release pack`).")],
) -> None:
    """Validate a release directory and store it on this host.

    Example: agent-fsm release add ./agent-fsm-2.0.0
    """
    from .packing import add

    added = add(directory, _node())
    verb = "already stored at" if added.already else "stored at"
    out.print(f"release {added.version} {verb} {added.path}", markup=False)


@release_app.command("list")
def release_list(
    as_json: Annotated[bool, typer.Option("--json", help="A JSON list.")] = False,
) -> None:
    """List the stored releases, marking the selected and the last-good.

    Example: agent-fsm release list --json
    """
    releases = _node().host.releases
    selected, last_good = releases.selected(), releases.last_good()
    rows = [{"version": v, "selected": v == selected, "last_good": v == last_good}
            for v in releases.versions()]
    if as_json:
        _json(rows)
        return
    for r in rows:
        marks = [m for m, on in (("selected", r["selected"]), ("last-good", r["last_good"])) if on]
        out.print(f"{r['version']}" + (f"  ({', '.join(marks)})" if marks else ""), markup=False)


@release_app.command("prune")
def release_prune() -> None:
    """Remove stored releases other than the selected, the last-good and a pending upgrade's.

    Example: agent-fsm release prune
    """
    from .packing import prune

    removed = prune(_node())
    out.print(f"removed {', '.join(removed)}" if removed else "nothing to prune", markup=False)


@app.command()
def install(
    version: Annotated[str, typer.Option("--version", help="A stored release to install.")],
    no_start: Annotated[bool, typer.Option("--no-start", help="Write and reload only.")] = False,
) -> None:
    """Install a release: select and trust it, write all assets, reload, enable and start.

    Example: agent-fsm install --version 1.0.0
    """
    from .operations import install as do_install

    out.print(do_install(_node(), version, start=not no_start).message, markup=False)


@app.command()
def activate(
    to: Annotated[str, typer.Option("--to", help="A stored release to switch to.")],
) -> None:
    """Switch directly to a release without judgment: no signal, all assets written.

    Example: agent-fsm activate --to 1.0.0
    """
    from .operations import activate as do_activate

    out.print(do_activate(_node(), to).message, markup=False)


@app.command()
def upgrade(
    to: Annotated[str, typer.Option("--to", help="A stored release to upgrade to.")],
    wait: Annotated[bool, typer.Option(
        "--wait", help="Follow the upgrade to its end: exit 0 when converged, 4 when rolled "
        "back.")] = False,
    timeout: Annotated[float, typer.Option(
        "--timeout", help="With --wait: give up following after S seconds (exit 1).")] = 600.0,
) -> None:
    """Upgrade to a release: write the signal, select it, reset the start limit, restart.

    Refused (exit 3) while the startup gate is closed or another upgrade is pending.

    Example: agent-fsm upgrade --to 2.0.0 --wait --timeout 300
    """
    from .errors import RolledBack
    from .operations import begin_upgrade, follow

    node = _node()
    doc = begin_upgrade(node, to)
    up = doc.upgrade
    assert up is not None
    out.print(f"upgrade {up.from_version} → {up.to_version} started; the candidate is "
              "being judged", markup=False)
    if not wait:
        return
    t0 = up.started

    def show(when: float, trigger: str, state: str) -> None:
        out.print(f"  +{when - t0:6.1f}s  {trigger:<18} → {state}", markup=False)

    result = follow(node, up.started, to, timeout, on_state=show)
    if result.outcome == "ok":
        out.print(f"upgrade to {to} judged ok; converged on {to}", markup=False)
        return
    raise RolledBack(f"the candidate {to} was judged failed; the node rolled back to "
                     f"{up.from_version}")


@app.command()
def recover() -> None:
    """Roll back to the last-good release when an upgrade is pending and not judged ok.

    Safe to run twice and when nothing is pending (then it says so and exits 0). The recovery
    unit runs this through the last-good's own recovery script.

    Example: agent-fsm recover
    """
    from .operations import recover as do_recover

    out.print(do_recover(_node()).message, markup=False)


@app.command()
def daemon() -> None:
    """Run as the agent unit's main process (Type=notify): judge or converge, open the gate,
    send READY=1, supervise the workload, stop cleanly on SIGTERM.

    Example (in the unit): ExecStart=/var/lib/agent-fsm/selected/bin/agent-fsm daemon
    """
    from .daemon import main as daemon_main

    raise typer.Exit(daemon_main(_node()))


@app.command()
def demo() -> None:
    """Show the whole story in a private systemd: install 1.0.0, upgrade to a good 2.0.0, then
    to a 3.0.0 that crashes at start with broken assets, and watch it roll back.

    Needs root, util-linux unshare/nsenter and systemd; touches nothing of the host outside its
    own directory under /var/lib/agent-fsm-e2e.

    Example: sudo agent-fsm demo
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
    out.print(f"final: {st['state']}, selected {st['selected']}, last-good {st['last_good']}, "
              f"gate {st['gate']}, signal {st['signal']}, last result "
              f"{st['last_result']['to']} {st['last_result']['outcome']}", markup=False)


def main() -> None:
    """The console script: run the app, turning expected failures into one line and a code."""
    try:
        app()
    except AgentFsmError as exc:
        err.print(f"agent-fsm: {exc}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except OSError as exc:
        err.print(f"agent-fsm: {exc}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(EXIT_ERROR)
