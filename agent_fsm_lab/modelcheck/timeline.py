"""A counterexample as a timeline people read: who ran (and whose code), the fault, what fired,
how it ended, and what is on disk after it; as `history` draws a node's transitions, one line
a step."""

from __future__ import annotations

from .search import Result, Violation


def render(v: Violation) -> str:
    lines = [f"rule broken: {v.name}: {v.detail}",
             f"shortest trace ({sum(1 for e, _ in v.trace if e is not None)} steps):"]
    n = 0
    for edge, after in v.trace:
        if edge is None:
            lines.append(f"       {after}")
            continue
        n += 1
        fault = f" [fault: {edge.fault}]" if edge.fault is not None else ""
        lines.append(f"  {n:>3}. {edge.who}{fault}")
        for fired in edge.fired:
            lines.append(f"         fired {fired}")
        if edge.end:
            lines.append(f"         → {edge.end}")
        lines.append(f"         on disk: {after}")
    return "\n".join(lines)


def report(result: Result) -> str:
    out = [result.figures()]
    if not result.violations:
        out.append("no rule broken")
    for v in result.violations:
        out.append("")
        out.append(render(v))
    return "\n".join(out)
