"""Output for people: the consoles, and the views of status, history and doctor as rich text.

Plain when piped (and not wrapped at 80 columns there), no styling at all with NO_COLOR.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..machine.vocabulary import StateName
from ..views.status.report import span

if TYPE_CHECKING:
    from ..views.doctor.checks import Finding
    from ..views.history import History
    from ..views.status.report import Status


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

# How a state reads (its tone, derived from the definition by the views) as a colour.
TONE_STYLE = {"ok": "green", "none": "dim", "busy": "yellow", "bad": "red"}


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=False))


def when(ts: float | None) -> str:
    if ts is None:
        return "—"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def words(value: str) -> str:
    """A value JSON spells as a name (`rolled_back`, `check_failed`) as people read it."""
    return value.replace("_", " ")


def commands(triggers: Sequence[str]) -> list[str]:
    """The `agent-fsm` commands that fire any of `triggers` (the machine's allowed ones)."""
    from ..machine.vocabulary import COMMANDS

    return [COMMANDS[t] for t in triggers if t in COMMANDS]


def show(renderable: RenderableType) -> None:
    """Print for people; piped, without the padding rich adds to the ends of lines."""
    if out.is_terminal:
        out.print(renderable)
        return
    with out.capture() as captured:
        out.print(renderable)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))
    sys.stdout.flush()


# status ---------------------------------------------------------------------------------------
def status_view(st: Status, diff: bool) -> RenderableType:
    """The human view of a `status.Status`: what is happening, and what may I do."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    state = Text()
    state.append(st.state, style=f"bold {TONE_STYLE[st.tone]}")
    state.append(f" — {st.meaning}")
    if st.state_seconds is not None:
        state.append(f" (for {span(st.state_seconds)})")
    table.add_row("state", state)
    table.add_row("now", st.situation)
    if st.config_fallback:
        f = st.config_fallback
        table.add_row("config", Text(f"{f['error']}; the way back uses last-good {f['version']}'s "
                                     f"settings kept in {f['kept']}; operator commands refuse "
                                     "the file until it is fixed", style="red"))
    role = " (the candidate)" if st.candidate and st.selected == st.candidate else ""
    table.add_row("selected", (st.selected or "—") + role)
    table.add_row("last-good", st.last_good or "—")
    if st.selected_damaged:
        table.add_row("damaged", Text(f"{st.selected_damaged['problem']}", style="red"))
    if st.way_back:
        w = st.way_back
        stamp = datetime.fromtimestamp(w["time"], UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        table.add_row("way back", Text(f"{w['words']} ({stamp})",
                                       style="yellow" if w["action"] == "repaired" else "red"))
    if st.candidate:
        table.add_row("candidate", st.candidate)
    if st.signal:
        s = st.signal
        left = s["deadline_in_seconds"]
        deadline = (f"deadline in {span(left)}" if left >= 0
                    else f"deadline passed {span(left)} ago")
        # the starts counted by the last-good's start check, when the candidate counted fewer
        attempt = max(s["attempt"], s.get("starts", 0))
        table.add_row("signal", f"upgrade {s['from']} → {s['to']}, attempt {attempt} of "
                      f"{s['max_attempts']}, started {span(s['age_seconds'])} ago, {deadline} "
                      f"({when(s['deadline'])})")
    else:
        table.add_row("signal", "none (no upgrade pending)")
    gate = Text()
    gate.append(st.gate, style="green" if st.gate == "open" else "yellow")
    gate.append(" (operations may start)" if st.gate == "open"
                else " (operations are refused until it opens)")
    table.add_row("gate", gate)
    table.add_row("units", units_view(st))
    if st.workload is not None:
        table.add_row("workload", workload_view(st.workload))
    if st.units is not None and st.units.writes_error:
        table.add_row("writes", Text(f"failing: {st.units.writes_error}", style="red"))
    if st.outbox and st.outbox["queued"]:
        since = st.outbox["publisher_unreachable_since"]
        table.add_row("outbox", Text(
            f"{st.outbox['queued']} result(s) queued for the publisher, retried by the daemon"
            + (f"; publisher unreachable since {when(since)}" if since else ""), style="yellow"))
    table.add_row("hold", hold_view(st))
    table.add_row("inhibitors", inhibitors_view(st))
    table.add_row("assets", assets_view(st))
    if st.last_result:
        r = st.last_result
        style = "green" if r["outcome"] == "ok" else "red"
        result = Text(f"{r['from']} → {r['to']}: ")
        result.append(words(r["outcome"]), style=style)
        result.append(f" at {when(r['time'])} ({span(st.time - r['time'])} ago)")
        if r.get("reason_class"):
            result.append(f" — {words(r['reason_class'])}: {r['reason']}")
        table.add_row("last result", result)
    else:
        table.add_row("last result", "none yet")
    if st.crash_loop:
        c = st.crash_loop
        table.add_row("crash loop", Text(f"crash-looping: {c['restarts']} restarts since "
                                         f"{when(c['since'])}, the last {span(st.time - c['last'])}"
                                         " ago", style="red"))
    if st.owed:
        table.add_row("owed", f"{st.owed['trigger']}: {', '.join(st.owed['effects'])} "
                      "(resumed by the next start)")
    for s in st.skipped:
        table.add_row("skipped", Text(f"{s['effect']} during {s['trigger']} at {when(s['time'])}: "
                                      f"{s['error']}", style="yellow"))
    for k in st.known_bad[0]:  # each refused by `upgrade` unless --force
        table.add_row("known bad", Text(f"{k['version']}: rolled back at {when(k['time'])} "
                                        f"({words(k['reason_class'])}: {k['reason']})",
                                        style="red"))
    if st.known_bad[1]:
        table.add_row("known bad", Text(st.known_bad[1], style="yellow"))
    for h in st.hooks:  # the host's [hooks]: run before or after these transitions
        row = Text(f"{h['when']}.{h['trigger']}: {shlex.join(h['argv'])}")
        if h["failed"]:
            row.append(f"; last run failed at {when(h['failed']['time'])}: {h['failed']['error']}",
                       style="red")
        table.add_row("hook", row)
    can = commands(st.allowed)
    table.add_row("commands", ", ".join(can) + " (allowed now)" if can else
                  "none of install, activate, upgrade, recover may run now")
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


def workload_view(w: dict[str, Any]) -> Text:
    """The selected release's workload: running (pid, since) or not, the last exit, restarts;
    writable paths the config grants that the agent unit on disk does not yet."""
    text = Text()
    if w["running"]:
        text.append("running", style="green")
        text.append(f" as {w['user']}, pid {w['pid']}, since {w['since']}")
    else:
        text.append("not running", style="red")
        text.append(f" (runs as {w['user']})")
    last = w["last_exit"]
    if last is not None:
        how = f"killed by {last['signal']}" if last["signal"] else f"exited with status {last['code']}"
        text.append(f"; last {how} at {last['time']}")
    if w["restarts"]:
        text.append(f"; {w['restarts']} restart(s) of the unit")
    text.append(f"\n{shlex.join(w['command'])}", style="dim")
    paths = w.get("writable_paths") or {}
    if paths.get("configured") and not paths.get("in_unit"):
        text.append(f"\nwritable paths {', '.join(paths['configured'])} are not in the agent "
                    "unit on disk yet: written at the next start that converges the assets, "
                    "granted from the unit's start after that", style="yellow")
    return text


def units_view(st: Status) -> Text:
    """The agent and recovery units as systemd sees them, or why that is unknown."""
    u = st.units
    if u is None or u.error is not None or u.agent is None or u.recovery is None:
        return Text(f"unit state unknown: {u.error if u else 'not read'}", style="dim")
    text = Text()
    for i, unit in enumerate((u.agent, u.recovery)):
        if i:
            text.append("; ")
        style = "red" if unit.failed else "yellow" if unit.retrying else ""
        text.append(f"{unit.unit} {unit.words()}", style=style)
        if unit.retrying and unit.next_try_in_seconds is not None:
            text.append(f", next try in {span(unit.next_try_in_seconds)}", style=style)
    if u.last_error:
        text.append(f"\nlast error: {u.last_error}", style="red")
    return text


def hold_view(st: Status) -> Text:
    """The operator's hold, and the command that lifts it."""
    h = st.hold
    if h is None:
        return Text("none")
    if h["error"]:
        return Text(f"{h['error']}: `agent-fsm unhold`", style="red")
    end = "until lifted" if h["until"] is None else f"until {when(h['until'])}"
    if h["expired"]:
        return Text(f"expired ({end}; no longer counts): {h['reason']!r}; remove it with "
                    "`agent-fsm unhold`", style="dim")
    return Text(f"upgrades held since {when(h['since'])} {end}: {h['reason']!r}; lift with "
                "`agent-fsm unhold` (or override once with `upgrade --force`)", style="yellow")


def inhibitors_view(st: Status) -> Text:
    """The workloads' inhibitors, each with how it is lifted."""
    text = Text("" if st.inhibitors else "none")
    for i in st.inhibitors:
        pid = "" if i["pid"] is None else f" (pid {i['pid']})"
        if i["stale"]:
            text.append(f"{i['name']}{pid}: {i['reason']!r}: stale, pid {i['pid']} is gone, not "
                        f"honoured; remove it: rm {i['file']}\n", style="dim")
        elif i["error"]:
            text.append(f"{i['file']}: {i['error']}; remove it: rm {i['file']}\n", style="red")
        else:
            text.append(f"{i['name']}{pid}: {i['reason']!r}: refuses upgrades until its workload "
                        f"removes {i['file']}\n", style="yellow")
    text.rstrip()
    return text


def assets_view(st: Status) -> Text:
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
    if drift and st.state == StateName.converged and not st.signal:
        text.append("the daemon's next start rewrites the ones that differ\n", style="dim")
    text.rstrip()
    return text


def watch(read: Callable[[], Status], view: Callable[[Status], RenderableType],
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
                    out.print(Text(f"— {when(data.time)}", style="dim"))
                    show(view(data))
                    out.file.flush()
                shown += 1
                if more():
                    time.sleep(interval)
            return

        def frame(data: Status) -> RenderableType:
            return Group(view(data), Text(f"\nrefreshing every {interval:g}s at {when(data.time)};"
                                          " Ctrl-C to stop", style="dim"))

        with Live(frame(read()), console=out, auto_refresh=False) as live:
            shown = 1
            while more():
                time.sleep(interval)
                live.update(frame(read()), refresh=True)
                shown += 1
    except KeyboardInterrupt:
        pass  # the way to stop watching; not an error


# history and doctor ---------------------------------------------------------------------------
def show_history(h: History) -> None:
    """The kept transitions as a table, or a line saying there are none (and why)."""
    if not h.entries:
        what = f"of an upgrade to {h.upgrade} " if h.upgrade else ""
        out.print(f"no transitions {what}in the kept history ({h.kept} kept, at most {h.limit})",
                  markup=False)
        return
    title = f"history of the upgrades to {h.upgrade}" if h.upgrade else "history"
    table = Table(title=title + " (times in UTC)", title_justify="left")
    for col in ("time", "trigger", "from → to", "versions", "lasted", "why"):
        table.add_column(col, no_wrap=col not in ("lasted", "why"))
    for e in h.entries:
        versions = f"{e.upgrade[0]} → {e.upgrade[1]}" if e.upgrade else (e.release or "")
        lasted = "" if e.lasted is None else span(e.lasted) + (" so far" if e.current else "")
        move = Text(f"{e.source} → ")
        move.append(e.dest, style=TONE_STYLE.get(h.tones.get(e.dest, ""), ""))
        stamp = datetime.fromtimestamp(e.time, UTC).strftime("%Y-%m-%d %H:%M:%S")
        why = "" if e.reason is None else f"{words(e.reason[0])}: {e.reason[1]}"
        if e.superseded_by:  # owed, never finished: the way back replaced it
            why = f"superseded by {e.superseded_by}" + (
                f" ({', '.join(e.unknown)} unknown here)" if e.unknown else "")
        if e.crash_loop is not None:  # one entry for a crash loop: its count, since when
            first = datetime.fromtimestamp(e.crash_loop[1], UTC).strftime("%Y-%m-%d %H:%M:%S")
            why = f"crash loop: {e.crash_loop[0]} restarts since {first}, the last at {stamp}"
        table.add_row(stamp, e.trigger, move, versions, lasted, why)
    show(table)
    shown = len(h.entries)
    if h.kept >= h.limit and shown == h.kept:
        out.print(Text(f"older transitions were trimmed (history_limit = {h.limit})",
                       style="dim"))


def show_doctor(findings: Sequence[Finding]) -> None:
    """The findings as a table: level, check, and what to do about each that is not ok."""
    table = Table(box=None, show_header=False, pad_edge=False)
    for col in ("level", "check", "finding"):
        table.add_column(col)
    mark = {"ok": "ok", "warn": "WARN", "fail": "FAIL"}
    for f in findings:
        detail = f.detail + (f"\n→ {f.fix}" if f.fix and f.level != "ok" else "")
        table.add_row(mark[f.level], f.check, detail)
    out.print(table)
