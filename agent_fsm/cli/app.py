"""The command line: parses options, calls the commands, renders their results, owns exit codes.

Nothing below this layer prints. Commands return data; here it becomes rich text for people
(plain when piped, no colour with NO_COLOR) or JSON for programs. Expected failures (every
AgentFsmError) become one line on stderr and a documented exit code, never a traceback.
"""

from __future__ import annotations

import enum
import json
import os
import shlex
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from .. import __version__, files
from ..errors import EXIT_ERROR, AgentFsmError
from ..node import config as config_mod
from ..views import diagram as diagram_mod
from ..views.status import span
from ..wiring import Node, open_node

if TYPE_CHECKING:
    from ..views.status import Status

EXIT_CODES = """\
Exit codes: 0 success; 1 error (one line on stderr says what and what to do); 2 usage;
3 refused (the gate is closed, an upgrade is pending, or the command is not allowed in the
current state); 4 (`upgrade --wait`) the candidate was judged failed and the node rolled back.
"""

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


def _console(*, stderr: bool = False) -> Console:
    # NO_COLOR (https://no-color.org): no colour and no other styling either, so no escapes.
    # Piped output is plain already: rich styles only a terminal.
    # Piped, lines are not wrapped at 80 columns (grep and logs read whole lines).
    plain = os.environ.get("NO_COLOR", "") != ""
    stream = sys.stderr if stderr else sys.stdout
    width = None if os.environ.get("COLUMNS") or stream.isatty() else 160
    return Console(stderr=stderr, color_system=None if plain else "auto", highlight=False,
                   width=width)


out = _console()
err = _console(stderr=True)


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
        "--config", metavar="FILE", help="Config file (TOML). Default: $AGENT_FSM_CONFIG, then "
        "/etc/agent-fsm/config.toml.", show_default=False)] = None,
    root: Annotated[Path | None, typer.Option(
        "--root", metavar="DIR", help="Write everything below DIR; unit contents keep host paths.",
        show_default=False)] = None,
    version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Print the version and exit.")] = False,
) -> None:
    _opts.config = config
    _opts.root = root


def _node() -> Node:
    return open_node(config_mod.load(_opts.config), _opts.root)


def _prog() -> str:
    """How this run was invoked, for the commands `status` suggests."""
    from .entry import invocation

    return invocation(_opts.config, _opts.root)


def _json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=False))


def _when(ts: float | None) -> str:
    if ts is None:
        return "—"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _show(renderable: RenderableType) -> None:
    """Print for people; piped, without the padding rich adds to the ends of lines."""
    if out.is_terminal:
        out.print(renderable)
        return
    with out.capture() as captured:
        out.print(renderable)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))
    sys.stdout.flush()


STATE_STYLE = {"converged": "green", "idle": "dim", "candidate_running": "yellow",
               "judged_ok": "yellow", "judged_failed": "red", "recovering": "red"}


# Inspection ---------------------------------------------------------------------------------
def _status_view(st: Status, diff: bool) -> RenderableType:
    """The human view of a `status.Status`: what is happening, and what may I do."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    state = Text()
    state.append(st.state, style=f"bold {STATE_STYLE.get(st.state, '')}")
    state.append(f" — {st.meaning}")
    if st.state_seconds is not None:
        state.append(f" (for {span(st.state_seconds)})")
    table.add_row("state", state)
    table.add_row("now", st.situation)
    role = " (the candidate)" if st.candidate and st.selected == st.candidate else ""
    table.add_row("selected", (st.selected or "—") + role)
    table.add_row("last-good", st.last_good or "—")
    if st.candidate:
        table.add_row("candidate", st.candidate)
    if st.signal:
        s = st.signal
        left = s["deadline_in_seconds"]
        deadline = (f"deadline in {span(left)}" if left >= 0
                    else f"deadline passed {span(left)} ago")
        table.add_row("signal", f"upgrade {s['from']} → {s['to']}, attempt {s['attempt']} of "
                      f"{s['max_attempts']}, started {span(s['age_seconds'])} ago, {deadline} "
                      f"({_when(s['deadline'])})")
    else:
        table.add_row("signal", "none (no upgrade pending)")
    gate = Text()
    gate.append(st.gate, style="green" if st.gate == "open" else "yellow")
    gate.append(" (operations may start)" if st.gate == "open"
                else " (operations are refused until it opens)")
    table.add_row("gate", gate)
    table.add_row("assets", _assets_view(st))
    if st.last_result:
        r = st.last_result
        style = "green" if r["outcome"] == "ok" else "red"
        result = Text(f"{r['from']} → {r['to']}: ")
        result.append(r["outcome"], style=style)
        result.append(f" at {_when(r['time'])} ({span(st.time - r['time'])} ago)")
        table.add_row("last result", result)
    else:
        table.add_row("last result", "none yet")
    if st.owed:
        table.add_row("owed", f"{st.owed['trigger']}: {', '.join(st.owed['effects'])} "
                      "(resumed by the next start)")
    table.add_row("triggers", ", ".join(st.allowed) or "none")
    nxt = Text(st.next.summary)
    if st.next.commands:
        nxt.append(": ")
        nxt.append("; ".join(st.next.commands), style="bold cyan")
    table.add_row("next", nxt)
    parts: list[RenderableType] = [table]
    if diff:
        diffs = [a.diff for a in st.assets if a.diff]
        for d in diffs:
            parts.append(Text(""))
            for line in d.splitlines():
                style = ("green" if line.startswith("+") else "red" if line.startswith("-")
                         else "cyan" if line.startswith("@@") else "")
                parts.append(Text(line, style=style))
        if not diffs:
            parts.append(Text(f"\nno asset differs from what {st.assets_compared_with} would "
                              "write" if st.assets_compared_with else "\nno release selected"))
    return Group(*parts)


def _assets_view(st: Status) -> Text:
    held = bool(st.held_assets)
    words = {"same": "same as {v}'s", "differs": "differs from {v}'s",
             "mode_differs": "mode differs from {v}'s", "missing": "missing",
             "unknown": "not compared"}
    v = st.assets_compared_with
    text = Text(f"held: the last-good's, kept byte for byte until the upgrade is judged; "
                f"compared with what {v} would write\n" if held else
                f"compared with what {v} would write\n" if v else "")
    width = max(len(a.path) for a in st.assets)
    for a in st.assets:
        what = words[a.compared].format(v=v)
        style = {"same": "", "differs": "yellow", "mode_differs": "yellow",
                 "missing": "red", "unknown": "dim"}[a.compared]
        text.append(f"{a.path:<{width}}  ")
        text.append(what + ("  (held)" if a.held else ""), style=style)
        text.append("\n")
    if st.assets_error:
        text.append(f"could not render {st.assets_compared_with}'s assets: {st.assets_error}\n",
                    style="red")
    drift = any(a.compared in ("differs", "mode_differs") for a in st.assets)
    if drift and st.state == "converged" and not st.signal:
        text.append("the daemon's next start rewrites the ones that differ\n", style="dim")
    text.rstrip()
    return text


def _watch(read: Callable[[], Status], view: Callable[[Status], RenderableType],
           as_json: bool, interval: float, count: int | None) -> None:
    """Refresh until interrupted (or `count` refreshes): live on a terminal, else one snapshot
    per interval (JSON: one object per line)."""
    shown = 0

    def more() -> bool:
        return count is None or shown < count

    try:
        if as_json or not out.is_terminal:
            while more():
                data = read()
                if as_json:
                    print(json.dumps(data.to_json()), flush=True)
                else:
                    if shown:
                        out.print()
                    out.print(Text(f"— {_when(data.time)}", style="dim"))
                    _show(view(data))
                    out.file.flush()
                shown += 1
                if more():
                    time.sleep(interval)
            return

        def frame(data: Status) -> RenderableType:
            return Group(view(data), Text(f"\nrefreshing every {interval:g}s at {_when(data.time)};"
                                          " Ctrl-C to stop", style="dim"))

        with Live(frame(read()), console=out, auto_refresh=False) as live:
            shown = 1
            while more():
                time.sleep(interval)
                live.update(frame(read()), refresh=True)
                shown += 1
    except KeyboardInterrupt:
        pass  # the way to stop watching; not an error


@app.command(epilog=EXIT_CODES)
def status(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object, for programs "
                                          "(with --watch: one object per line).")] = False,
    diff: Annotated[bool, typer.Option(
        "--diff", help="Show how each asset on disk differs from what the selected release "
        "would write (a unified diff).")] = False,
    watch: Annotated[bool, typer.Option(
        "--watch", help="Refresh until interrupted (Ctrl-C).")] = False,
    interval: Annotated[float | None, typer.Option(
        "--interval", min=0.1, metavar="S", help="With --watch: seconds between refreshes (default 2).",
        show_default=False)] = None,
    count: Annotated[int | None, typer.Option(
        "--count", min=1, metavar="N", help="With --watch: stop after N refreshes.",
        show_default=False)] = None,
) -> None:
    """Show what is happening on this node and what you may do next: the state and its meaning,
    the releases, the signal (age, attempt, deadline), the gate, the held assets, the last
    result and the next action as a command to run.

    Example: agent-fsm status --watch --interval 1
    """
    from ..views.status import status as get_status

    node = _node()

    def read() -> Status:
        return get_status(node, diff=diff, prog=_prog())

    if watch:
        _watch(read, lambda st: _status_view(st, diff), as_json,
               2.0 if interval is None else interval, count)
        return
    if interval is not None or count is not None:
        raise typer.BadParameter("only with --watch", param_hint="--interval/--count")
    st = read()
    if as_json:
        _json(st.to_json())
        return
    _show(_status_view(st, diff))


@app.command(epilog=EXIT_CODES)
def history(
    as_json: Annotated[bool, typer.Option("--json", help="A JSON list, oldest first.")] = False,
    limit: Annotated[int, typer.Option(
        "--limit", min=1, metavar="N", help="Show the last N transitions.")] = 50,
    upgrade: Annotated[str | None, typer.Option(
        "--upgrade", metavar="VERSION", help="Only the transitions of upgrades to VERSION.",
        show_default=False)] = None,
) -> None:
    """Show the transitions the machine went through, oldest first: when, the trigger, from →
    to, the versions, and how long the node stayed in each state.

    The state file keeps the last `history_limit` transitions (config; default 200).

    Example: agent-fsm history --upgrade 2.0.0 --limit 10
    """
    from ..views.history import history as get_history

    h = get_history(_node(), limit=limit, upgrade=upgrade)
    if as_json:
        _json(h.to_json())
        return
    if not h.entries:
        what = f"of an upgrade to {h.upgrade} " if h.upgrade else ""
        out.print(f"no transitions {what}in the kept history ({h.kept} kept, at most {h.limit})",
                  markup=False)
        return
    title = f"history of the upgrades to {h.upgrade}" if h.upgrade else "history"
    table = Table(title=title + " (times in UTC)", title_justify="left")
    for col in ("time", "trigger", "from → to", "versions", "lasted"):
        table.add_column(col, no_wrap=col != "lasted")
    for e in h.entries:
        versions = f"{e.upgrade[0]} → {e.upgrade[1]}" if e.upgrade else (e.release or "")
        lasted = "" if e.lasted is None else span(e.lasted) + (" so far" if e.current else "")
        move = Text(f"{e.source} → ")
        move.append(e.dest, style=STATE_STYLE.get(e.dest, ""))
        when = datetime.fromtimestamp(e.time, UTC).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(when, e.trigger, move, versions, lasted)
    _show(table)
    shown = len(h.entries)
    if h.kept >= h.limit and shown == h.kept:
        out.print(Text(f"older transitions were trimmed (history_limit = {h.limit})",
                       style="dim"))


class DiagramFormat(enum.StrEnum):
    mermaid = "mermaid"
    dot = "dot"
    svg = "svg"
    markdown = "markdown"


@app.command(epilog=EXIT_CODES)
def diagram(
    fmt: Annotated[DiagramFormat, typer.Option(
        "--format", help="mermaid, dot, svg (rendered by graphviz's `dot`, which must be "
        "installed) or markdown (the committed page: diagram, states, transition table).")
    ] = DiagramFormat.mermaid,
    output: Annotated[Path | None, typer.Option(
        "--output", metavar="FILE", help="Write to FILE instead of stdout.",
        show_default=False)] = None,
    current: Annotated[bool, typer.Option(
        "--current", help="Highlight the node's current state (reads the state file).")] = False,
    check: Annotated[bool, typer.Option(
        "--check", help="Exit 1 if the committed page under --dir is stale.")] = False,
    write: Annotated[bool, typer.Option(
        "--write", help="Regenerate the committed page under --dir.")] = False,
    directory: Annotated[Path, typer.Option(
        "--dir", help="Where the committed diagram page lives.")] = Path("diagrams"),
) -> None:
    """Print the machine as a diagram, generated from its definition in states/.

    Example: agent-fsm diagram --format svg --current --output machine.svg
    """
    from ..lifecycle.engine import load_definition

    d = diagram_mod.from_definition(load_definition())
    page = directory / diagram_mod.DIAGRAM_FILE
    if check or write:
        expected = diagram_mod.markdown(d)
        if write:
            directory.mkdir(parents=True, exist_ok=True)
            page.write_text(expected, encoding="utf-8")
            err.print(f"wrote {page}", markup=False)
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
        err.print(f"{page} matches the machine definition", markup=False)
        return
    highlight = _node().store.read().state if current else None
    text = {
        DiagramFormat.mermaid: lambda: diagram_mod.mermaid(d, highlight),
        DiagramFormat.dot: lambda: diagram_mod.dot(d, highlight),
        DiagramFormat.svg: lambda: diagram_mod.svg(d, highlight),
        DiagramFormat.markdown: lambda: diagram_mod.markdown(d),
    }[fmt]()
    if output is not None:
        files.atomic_write(output, text.encode(), 0o644)
        err.print(f"wrote {output}", markup=False)
        return
    sys.stdout.write(text)


@app.command(epilog=EXIT_CODES)
def metrics(
    output: Annotated[Path | None, typer.Option(
        "--output", metavar="PATH", help="Write the file atomically (for node_exporter's "
        "textfile collector, name it *.prom) instead of printing it.", show_default=False)
    ] = None,
) -> None:
    """Print the node's metrics in Prometheus' text format: the state, upgrades by outcome,
    rollbacks, attempts, seconds in the current state, the last transition's time.

    Example: agent-fsm metrics --output /var/lib/node_exporter/textfile/agent-fsm.prom
    """
    from ..views.metrics import collect, exposition

    text = exposition(collect(_node()))
    if output is None:
        sys.stdout.write(text)
        return
    files.atomic_write(output, text.encode(), 0o644)


# Diagnosis ----------------------------------------------------------------------------------
@app.command(epilog=EXIT_CODES)
def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="A JSON list of findings.")] = False,
) -> None:
    """Check the host and say what to do about each finding: systemd's version, the rendered
    units, directory ownership and modes, the lock's filesystem, the state file, the signal and
    the gate against the state, the assets. Exits 1 when any check fails.

    Example: agent-fsm doctor --json
    """
    from ..views.doctor import doctor as run_doctor

    findings = run_doctor(_node())
    failed = any(f.level == "fail" for f in findings)
    if as_json:
        _json([f.to_json() for f in findings])
    else:
        table = Table(box=None, show_header=False, pad_edge=False)
        for col in ("level", "check", "finding"):
            table.add_column(col)
        mark = {"ok": "ok", "warn": "WARN", "fail": "FAIL"}
        for f in findings:
            detail = f.detail + (f"\n→ {f.fix}" if f.fix and f.level != "ok" else "")
            table.add_row(mark[f.level], f.check, detail)
        out.print(table)
    if failed:
        raise typer.Exit(EXIT_ERROR)


# Operations ---------------------------------------------------------------------------------
release_app = typer.Typer(
    help="Make, add, list and prune releases.\n\nExample: agent-fsm release list --json",
    no_args_is_help=True, epilog=EXIT_CODES)
app.add_typer(release_app, name="release")


@release_app.command("pack", epilog=EXIT_CODES)
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
    from ..actions.packing import pack

    path = pack(version, output, tuple(shlex.split(workload)) if workload else ())
    out.print(f"packed release {version} in {path}", markup=False)


@release_app.command("add", epilog=EXIT_CODES)
def release_add(
    directory: Annotated[Path, typer.Argument(help="A release directory (from `release pack`).")],
) -> None:
    """Validate a release directory and store it on this host.

    Example: agent-fsm release add ./agent-fsm-2.0.0
    """
    from ..actions.packing import add

    added = add(directory, _node())
    verb = "already stored at" if added.already else "stored at"
    out.print(f"release {added.version} {verb} {added.path}", markup=False)


@release_app.command("list", epilog=EXIT_CODES)
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


@release_app.command("prune", epilog=EXIT_CODES)
def release_prune() -> None:
    """Remove stored releases other than the selected, the last-good and a pending upgrade's.

    Example: agent-fsm release prune
    """
    from ..actions.packing import prune

    removed = prune(_node())
    out.print(f"removed {', '.join(removed)}" if removed else "nothing to prune", markup=False)


@app.command(epilog=EXIT_CODES)
def install(
    version: Annotated[str, typer.Option("--version", help="A stored release to install.")],
    no_start: Annotated[bool, typer.Option("--no-start", help="Write and reload only.")] = False,
) -> None:
    """Install a release: select and trust it, write all assets, reload, enable and start.

    Example: agent-fsm install --version 1.0.0
    """
    from ..actions.operations import install as do_install

    out.print(do_install(_node(), version, start=not no_start).message, markup=False)


@app.command(epilog=EXIT_CODES)
def activate(
    to: Annotated[str, typer.Option("--to", help="A stored release to switch to.")],
) -> None:
    """Switch directly to a release without judgment: no signal, all assets written.

    Example: agent-fsm activate --to 1.0.0
    """
    from ..actions.operations import activate as do_activate

    out.print(do_activate(_node(), to).message, markup=False)


@app.command(epilog=EXIT_CODES)
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
    from ..actions.operations import begin_upgrade, follow
    from ..errors import RolledBack

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


@app.command(epilog=EXIT_CODES)
def recover() -> None:
    """Roll back to the last-good release when an upgrade is pending and not judged ok.

    Safe to run twice and when nothing is pending (then it says so and exits 0). The recovery
    unit runs this through the last-good's own recovery script.

    Example: agent-fsm recover
    """
    from ..actions.operations import recover as do_recover

    out.print(do_recover(_node()).message, markup=False)


@app.command(epilog=EXIT_CODES)
def daemon() -> None:
    """Run as the agent unit's main process (Type=notify): judge or converge, open the gate,
    send READY=1, supervise the workload, stop cleanly on SIGTERM.

    Example (in the unit): ExecStart=/var/lib/agent-fsm/selected/bin/agent-fsm daemon
    """
    from ..agent.daemon import main as daemon_main

    raise typer.Exit(daemon_main(_node()))


@app.command(epilog=EXIT_CODES)
def demo() -> None:
    """Show the whole story in a private systemd: install 1.0.0, upgrade to a good 2.0.0, then
    to a 3.0.0 that crashes at start with broken assets, and watch it roll back.

    Needs root, util-linux unshare/nsenter and systemd; touches nothing of the host outside its
    own directory under /var/lib/agent-fsm-e2e.

    Example: sudo agent-fsm demo
    """
    from agent_fsm_lab.demo import run as run_demo

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
