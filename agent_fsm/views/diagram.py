"""Diagrams of the machine for reviewers: definition -> plain dataclasses -> a renderer.

The renderers (mermaid, dot, a markdown page with the transition table) work on `Diagram`, so they
are tested on hand-built diagrams. `from_definition` is the only bridge to `states/`. `check_page`
compares a committed page with what `markdown` renders: `agent-fsm diagram --check` and the lab's
check (`make lint`) both run it.
"""

from __future__ import annotations

import shlex
import shutil
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

from .. import files
from ..errors import AgentFsmError
from ..machine.definition import MEANINGS, Definition, OnRecover, OnStart
from ..system import proc

DIAGRAM_FILE = "agent-upgrade.md"
FORMATS = ("mermaid", "dot", "svg", "markdown")


@dataclass(frozen=True)
class Node:
    name: str
    description: str
    on_start: str = ""  # what a daemon start does here
    on_recover: str = ""  # what `recover` does here


@dataclass(frozen=True)
class Edge:
    trigger: str
    source: str
    dest: str
    conditions: tuple[str, ...]
    effects: tuple[str, ...]  # in order; a tolerant one ends in "?", one done at own start "*"
    supersedes: tuple[str, ...] = ()  # owed transitions it replaces instead of resuming
    by: tuple[str, ...] = ()  # the roles whose process may fire it


@dataclass(frozen=True)
class Diagram:
    name: str
    initial: str
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    source: str = "states/agent-upgrade.toml"
    actions: tuple[tuple[str, str], ...] = ()  # each on_start and on_recover name, in words


def from_definition(d: Definition) -> Diagram:
    edges = tuple(
        Edge(t.trigger, s, t.dest, t.conditions,
             tuple(e.name + ("?" if e.tolerant else "") + ("*" if e.done_at_own_start else "")
                   for e in t.effects), t.supersedes, tuple(t.by))
        for t in d.transitions for s in t.sources
    )
    nodes = tuple(Node(s.name, s.description, s.on_start, s.on_recover) for s in d.states)
    actions = tuple((str(a), MEANINGS[a]) for a in (*OnStart, *OnRecover))
    return Diagram(d.name, d.initial, nodes, edges, actions=actions)


def mermaid(diagram: Diagram, highlight: str | None = None) -> str:
    lines = ["stateDiagram-v2", f"    [*] --> {diagram.initial}"]
    lines += [f"    {e.source} --> {e.dest}: {e.trigger}" for e in diagram.edges]
    if highlight is not None:
        lines += ["    classDef current fill:#ffd54f,stroke:#e65100,stroke-width:3px",
                  f"    class {highlight} current"]
    return "\n".join(lines) + "\n"


def dot(diagram: Diagram, highlight: str | None = None) -> str:
    lines = [f'digraph "{diagram.name}" {{', "    rankdir=LR;",
             '    node [shape=box, style="rounded"];',
             '    __start [shape=point, label=""];',
             f"    __start -> {diagram.initial};"]
    for n in diagram.nodes:
        style = ', style="rounded,filled,bold", fillcolor="#ffd54f"' if n.name == highlight else ""
        lines.append(f'    {n.name} [label="{n.name}", tooltip="{_quoted(n.description)}"{style}];')
    for e in diagram.edges:
        # The tooltip (shown on hover in an SVG) gives reviewers the conditions and effects.
        tip = "; ".join(part for part in (
            "if " + ", ".join(e.conditions) if e.conditions else "",
            " -> ".join(e.effects) if e.effects else "no effects") if part)
        lines.append(f'    {e.source} -> {e.dest} [label="{e.trigger}", tooltip="{tip}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def svg(diagram: Diagram, highlight: str | None = None, *, executable: str = "dot",
        timeout: float = 60.0) -> str:
    """The dot diagram rendered by graphviz (`dot -Tsvg`); a clear error when it is missing."""
    found = shutil.which(executable)
    if found is None:
        raise AgentFsmError(
            f"graphviz is not installed (`{executable}` is not on PATH); install it (e.g. "
            "`apt-get install graphviz`) or print `--format dot` and render it elsewhere"
        )
    try:
        done = proc.run([found, "-Tsvg"], timeout=timeout, stdin=dot(diagram, highlight))
    except proc.CouldNotRun as exc:
        raise AgentFsmError(f"graphviz (`{found} -Tsvg`) could not run: {exc.reason}") from None
    if done.returncode != 0 or "<svg" not in done.stdout:
        # stderr only: stdout without an SVG in it is not a message
        raise AgentFsmError(f"graphviz (`{found} -Tsvg`) exited {done.returncode}: "
                            f"{proc.last_line(done.stderr) or 'no SVG on its output'}")
    return done.stdout


def _cell(items: tuple[str, ...], sep: str) -> str:
    return sep.join(f"`{i}`" for i in items) if items else "—"


def _given(name: str) -> tuple[str, ...]:
    return (name,) if name else ()


def markdown(diagram: Diagram) -> str:
    """The page committed as diagrams/agent-upgrade.md: the diagram, the states (with what a start
    and `recover` do in each), and the transition table."""
    out = [
        f"# The `{diagram.name}` machine",
        "",
        f"Generated from `{diagram.source}` by `make diagram`; do not edit by hand.",
        "`make test` fails when this page no longer matches the definition.",
        "",
        "```mermaid",
        mermaid(diagram).rstrip("\n"),
        "```",
        "",
        "## States",
        "",
        "Each state declares what a daemon start does there (*on start*) and what "
        "`agent-fsm recover` does",
        "(*on recover*); `status` advises from the same. Both first resume what a crash left "
        "owed and, from",
        "the sources of `orphaned_signal`, roll back a signal the state file does not know.",
        "",
        "| state | meaning | on start | on recover |",
        "| --- | --- | --- | --- |",
    ]
    out += [f"| `{n.name}` | {n.description} | {_cell(_given(n.on_start), '')} | "
            f"{_cell(_given(n.on_recover), '')} |" for n in diagram.nodes]
    if diagram.actions:
        out += ["", "| on start or on recover | what it does |", "| --- | --- |"]
        out += [f"| `{name}` | {meaning} |" for name, meaning in diagram.actions]
    out += [
        "",
        "## Transitions",
        "",
        "Effects run in the order shown and are recorded before they run, so a crash resumes "
        "them; one marked `?` may fail without failing the transition (its failure is logged).",
        "One marked `*` counts as done when the agent unit's own start, running the release "
        "selected now,",
        "resumes it: that start is the restart it owed.",
        "A transition that *supersedes* others replaces one of them left owed by a crash instead",
        "of resuming it (recorded in the history as superseded).",
        "*By* names the roles whose process may fire it: `operator` (an operator's command), "
        "`candidate`",
        "(the daemon started from the candidate's release), `last_good` (the daemon started "
        "from the last-good",
        "release), `recovery` (`agent-fsm recover`, the last-good's). Any other process exits "
        "without touching",
        "the state; a transition left owed is finished by a role running the same release's "
        "code, or, if it is",
        "the operator's, by any. The agent unit's start check (`agent-fsm start-check`, the "
        "last-good's ExecStartPre=)",
        "has no role here: it fires no transition, it only counts a candidate's starts in the "
        "signal.",
        "",
        "| trigger | by | from | to | conditions | effects, in order | supersedes |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    out += [
        f"| `{e.trigger}` | {_cell(e.by, ', ')} | `{e.source}` | `{e.dest}` | "
        f"{_cell(e.conditions, ', ')} | {_cell(e.effects, ' → ')} | {_cell(e.supersedes, ', ')} |"
        for e in diagram.edges
    ]
    return "\n".join(out) + "\n"


def check_page(diagram: Diagram, directory: Path) -> Path:
    """The page under `directory` when it is byte for byte what `markdown` renders.

    Raises an AgentFsmError naming the page and the commands that rewrite it when the page differs
    or is missing. Reads at most the rendered page's size, and never waits on a FIFO.
    """
    page = directory / DIAGRAM_FILE
    if not directory.is_dir():
        what = "is not a directory" if directory.exists() else "does not exist"
        raise AgentFsmError(f"no diagram page to check: {directory.absolute()} {what}; run from the "
                            "checkout's root (which holds diagrams/) or name the directory with --dir")
    rewrite = (f"run `make diagram` in its checkout (or `agent-fsm diagram --format markdown "
               f"--output {shlex.quote(str(page))}`) and commit the result")
    expected = markdown(diagram).encode()
    try:
        actual = files.read_regular(page.resolve(), len(expected))  # a linked page is read too
    except FileNotFoundError:
        raise AgentFsmError(f"no diagram page {page}: {rewrite}") from None
    except ValueError as exc:
        raise AgentFsmError(f"{page} differs from what the machine's definition renders ({exc}): "
                            f"{rewrite}") from None
    if actual != expected:
        line = _first_difference(actual, expected)
        raise AgentFsmError(f"{page} differs from what the machine's definition renders (from "
                            f"line {line}): {rewrite}")
    return page


def _first_difference(actual: bytes, expected: bytes) -> int:
    """The number, from 1, of the first line where `actual` and `expected` differ (they do)."""
    pairs = zip_longest(actual.split(b"\n"), expected.split(b"\n"))
    return next(n for n, (a, e) in enumerate(pairs, 1) if a != e)
