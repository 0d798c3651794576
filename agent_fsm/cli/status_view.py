"""`status` for people: the view and its parts as rich text, and `--watch`, which redraws it as the
node changes."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.console import Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..machine.vocabulary import StateName
from ..node.state.reasons import MAX_REASON
from ..untrusted import MAX_LINE, quoted, shown
from ..views.status.advice import restarts
from ..views.status.report import span
from .render import TONE_STYLE, commands, out, show, when, words

if TYPE_CHECKING:
    from ..views.status.report import Status


def channel_view(ch: dict[str, Any]) -> Text:
    """The channel in one line, and a line for each version not taken and why."""
    head = f"{shown(ch['name'])} at {shown(ch['url'])}"
    if ch["error"]:
        return Text(f"{head}: {shown(ch['error'], MAX_LINE)}", style="red")
    if ch["time"] is None:
        text = Text(f"{head}: not looked at yet (`agent-fsm follow`, or its timer)")
        _timer_line(text, ch)
        return text
    style = {"refused": "red", "failed": "red", "rolled_back": "red", "held": "yellow"}.get(
        ch["outcome"], "")
    seen = "" if ch["seen"] is None else f", index version {ch['seen']['version']}"
    text = Text(f"{head}{seen}: {when(ch['time'])}: {shown(ch['message'], MAX_LINE)}",
                style=style)
    _timer_line(text, ch)
    for a in ch["available"]:
        if a["why_not"] is not None:
            text.append(f"\n  {shown(a['version'])}: {shown(a['why_not'], MAX_LINE)}")
    return text


def _timer_line(text: Text, ch: dict[str, Any]) -> None:
    """The follow timer as systemd has it, when systemd could say."""
    timer = ch.get("timer")
    if timer is None or timer == "unknown":
        return
    nxt = "" if ch.get("next_run") is None else f", next run {when(ch['next_run'])}"
    text.append(f"\n  follow timer {shown(timer)}{nxt}",
                style="" if timer == "active" else "yellow")


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
        table.add_row("config", Text(f"{shown(f['error'], MAX_LINE)}; the way back uses last-good "
                                     f"{f['version']}'s settings kept in {shown(f['kept'])}; "
                                     "operator commands refuse "
                                     "the file until it is fixed", style="red"))
    role = " (the candidate)" if st.candidate and st.selected == st.candidate else ""
    table.add_row("selected", (st.selected or "—") + role)
    table.add_row("last-good", st.last_good or "—")
    if st.selected_damaged:
        table.add_row("damaged", Text(shown(st.selected_damaged["problem"], MAX_LINE),
                                      style="red"))
    if st.way_back:
        w = st.way_back
        table.add_row("way back", Text(f"{shown(w['words'], MAX_LINE)} ({when(w['time'])})",
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
    if st.channel is not None:
        table.add_row("channel", channel_view(st.channel))
    if st.units is not None and st.units.writes_error:
        table.add_row("writes", Text(f"failing: {shown(st.units.writes_error, MAX_LINE)}",
                                     style="red"))
    if st.outbox and st.outbox["queued"]:
        since = st.outbox["publisher_unreachable_since"]
        table.add_row("outbox", Text(
            f"{st.outbox['queued']} result(s) queued for the publisher, retried by the daemon"
            + (f"; publisher unreachable since {when(since)}" if since else ""), style="yellow"))
    table.add_row("hold", hold_view(st))
    table.add_row("inhibitors", inhibitors_view(st))
    table.add_row("assets", assets_view(st))
    if st.store is not None:
        table.add_row("store", Text(st.store.words(), style="red" if st.store.short else ""))
    if st.last_result:
        r = st.last_result
        style = "green" if r["outcome"] == "ok" else "red"
        result = Text(f"{r['from']} → {r['to']}: ")
        result.append(words(r["outcome"]), style=style)
        result.append(f" at {when(r['time'])} ({span(st.time - r['time'])} ago)")
        if r.get("channel"):
            result.append(f", followed from channel {shown(r['channel']['name'])} at index "
                          f"version {r['channel']['index_version']}")
        if r.get("reason_class"):
            result.append(f" — {words(shown(r['reason_class']))}: {shown(r['reason'], MAX_REASON)}")
        table.add_row("last result", result)
    else:
        table.add_row("last result", "none yet")
    if st.crash_loop:
        c = st.crash_loop
        table.add_row("crash loop" if c["restarts"] > 1 else "restarted", Text(restarts(
            c["restarts"], when(c["since"]), f"{span(st.time - c['last'])} ago"), style="red"))
    if st.owed:
        table.add_row("owed", Text(f"{shown(st.owed['trigger'])}: "
                                   f"{shown(', '.join(st.owed['effects']))} (resumed by the next "
                                   "start)"))
    for s in st.skipped:
        table.add_row("skipped", Text(f"{shown(s['effect'])} during {shown(s['trigger'])} at "
                                      f"{when(s['time'])}: {shown(s['error'], MAX_LINE)}",
                                      style="yellow"))
    for k in st.known_bad[0]:  # each refused by `upgrade` unless --force
        table.add_row("known bad", Text(f"{shown(k['version'])}: rolled back at {when(k['time'])} "
                                        f"({words(shown(k['reason_class']))}: "
                                        f"{shown(k['reason'], MAX_REASON)})", style="red"))
    if st.known_bad[1]:
        table.add_row("known bad", Text(shown(st.known_bad[1], MAX_LINE), style="yellow"))
    for h in st.hooks:  # the host's [hooks]: run before or after these transitions
        row = Text(f"{h['when']}.{h['trigger']}: {shown(shlex.join(h['argv']), MAX_LINE)}")
        if h["failed"]:
            row.append(f"; last run failed at {when(h['failed']['time'])}: "
                       f"{shown(h['failed']['error'], MAX_LINE)}", style="red")
        table.add_row("hook", row)
    can = commands(st.allowed)
    table.add_row("commands", ", ".join(can) + " (allowed now)" if can else
                  "none of install, activate, upgrade, recover may run now")
    nxt = Text(shown(st.next.summary, MAX_LINE))
    if st.next.commands:
        nxt.append(": ")
        nxt.append(shown("; ".join(st.next.commands), MAX_LINE), style="bold cyan")
    table.add_row("next", nxt)
    parts: list[RenderableType] = [table]
    if diff:
        diffs = [a.diff for a in st.assets if a.diff]
        for d in diffs:
            parts.append(Text(""))
            for line in d.splitlines():  # of a release's templates: untrusted text too
                style = ("green" if line.startswith("+") else "red" if line.startswith("-")
                         else "cyan" if line.startswith("@@") else "")
                parts.append(Text(shown(line, MAX_LINE), style=style))
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
        text.append(f" as {shown(w['user'])}, pid {w['pid']}, since {shown(w['since'])}")
    else:
        text.append("not running", style="red")
        text.append(f" (runs as {shown(w['user'])})")
    last = w["last_exit"]
    if last is not None:
        how = f"killed by {last['signal']}" if last["signal"] else f"exited with status {last['code']}"
        text.append(f"; last {shown(how)} at {shown(last['time'])}")
    if w["restarts"]:
        text.append(f"; {w['restarts']} restart(s) of the unit")
    text.append(f"\n{shown(shlex.join(w['command']), MAX_LINE)}", style="dim")
    paths = w.get("writable_paths") or {}
    if paths.get("configured") and not paths.get("in_unit"):
        text.append(f"\nwritable paths {shown(', '.join(paths['configured']), MAX_LINE)} are not "
                    "in the agent "
                    "unit on disk yet: written at the next start that converges the assets, "
                    "granted from the unit's start after that", style="yellow")
    return text


def units_view(st: Status) -> Text:
    """The agent and recovery units as systemd sees them, or why that is unknown."""
    u = st.units
    if u is None or u.error is not None or u.agent is None or u.recovery is None:
        return Text(f"unit state unknown: {shown(u.error, MAX_LINE) if u else 'not read'}",
                    style="dim")
    text = Text()
    for i, unit in enumerate((u.agent, u.recovery)):
        if i:
            text.append("; ")
        style = "red" if unit.failed else "yellow" if unit.retrying else ""
        text.append(f"{shown(unit.unit)} {shown(unit.words())}", style=style)
        if unit.retrying and unit.next_try_in_seconds is not None:
            text.append(f", next try in {span(unit.next_try_in_seconds)}", style=style)
    if u.last_error:
        text.append(f"\nlast error: {shown(u.last_error, MAX_LINE)}", style="red")
    return text


def hold_view(st: Status) -> Text:
    """The operator's hold, and the command that lifts it."""
    h = st.hold
    if h is None:
        return Text("none")
    if h["error"]:
        return Text(f"{shown(h['error'], MAX_LINE)}: `agent-fsm unhold`", style="red")
    end = "until lifted" if h["until"] is None else f"until {when(h['until'])}"
    if h["expired"]:
        return Text(f"expired ({end}; no longer counts): {quoted(h['reason'], MAX_REASON)}; "
                    "remove it with "
                    "`agent-fsm unhold`", style="dim")
    return Text(f"upgrades held since {when(h['since'])} {end}: {quoted(h['reason'], MAX_REASON)}"
                "; lift with "
                "`agent-fsm unhold` (or override once with `upgrade --force`)", style="yellow")


def inhibitors_view(st: Status) -> Text:
    """The workloads' inhibitors, each with how it is lifted."""
    text = Text("" if st.inhibitors else "none")
    for i in st.inhibitors:
        pid = "" if i["pid"] is None else f" (pid {i['pid']})"
        name, reason, file = shown(i["name"]), quoted(i["reason"]), shown(i["file"])
        if i["stale"]:
            text.append(f"{name}{pid}: {reason}: stale, pid {i['pid']} is gone, not "
                        f"honoured; remove it: rm {file}\n", style="dim")
        elif i["error"]:
            text.append(f"{file}: {shown(i['error'], MAX_LINE)}; remove it: rm {file}\n",
                        style="red")
        else:
            text.append(f"{name}{pid}: {reason}: refuses upgrades until its workload "
                        f"removes {file}\n", style="yellow")
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
    paths = [shown(a.path) for a in st.assets]
    width = max(len(p) for p in paths)
    for a, path in zip(st.assets, paths, strict=True):
        what = words[a.compared].format(v=v)
        style = {"same": "", "differs": "yellow", "mode_differs": "yellow",
                 "missing": "red", "unknown": "dim"}[a.compared]
        text.append(f"{path:<{width}}  ")
        text.append(what + ("  (held)" if a.held else ""), style=style)
        text.append("\n")
    if st.assets_error:
        text.append(f"could not render {st.assets_compared_with}'s assets: "
                    f"{shown(st.assets_error, MAX_LINE)}\n", style="red")
    drift = any(a.compared in ("differs", "mode_differs") for a in st.assets)
    if drift and st.state == StateName.converged and not st.signal:
        text.append("the daemon's next start rewrites the ones that differ\n", style="dim")
    text.rstrip()
    return text


def watch(read: Callable[[], Status], view: Callable[[Status], RenderableType],
          as_json: bool, interval: float, count: int | None) -> None:
    """Refresh until interrupted (or `count` refreshes): live on a terminal, else one snapshot
    per interval (JSON: one object per line)."""
    frames = 0

    def more() -> bool:
        return count is None or frames < count

    try:
        if as_json or not out.is_terminal:
            while more():
                data = read()
                if as_json:
                    print(json.dumps(data.to_json()), flush=True)
                else:
                    if frames:
                        out.print()
                    out.print(Text(f"— {when(data.time)}", style="dim"))
                    show(view(data))
                    out.file.flush()
                frames += 1
                if more():
                    time.sleep(interval)
            return

        def frame(data: Status) -> RenderableType:
            return Group(view(data), Text(f"\nrefreshing every {interval:g}s at {when(data.time)};"
                                          " Ctrl-C to stop", style="dim"))

        with Live(frame(read()), console=out, auto_refresh=False) as live:
            frames = 1
            while more():
                time.sleep(interval)
                live.update(frame(read()), refresh=True)
                frames += 1
    except KeyboardInterrupt:
        pass  # the way to stop watching; not an error


# history and doctor ---------------------------------------------------------------------------
