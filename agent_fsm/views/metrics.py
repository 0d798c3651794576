"""What `metrics` reports: the node in Prometheus' text format, for node_exporter's textfile
collector or anything that scrapes a file.

`collect` reads the node, without the lock, into plain `Family` dataclasses; `exposition` renders
them as text format 0.0.4. Every sample has an `agent` label with the configured name, so two agents
on one host do not collide. The counters live in the state file, advanced in the write of each
transition, so they never go down. The journal is never read here: the state file keeps the current
stay's start and the last transition's time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import DocumentError
from ..node.channel import record as channel_record
from ..node.records import hold, known_bad
from ..node.runtime import inhibitors
from ..node.runtime import workload as workload_state
from ..node.state.counters import Counters
from ..node.state.reasons import CLASSES, ReasonClass
from ..node.state.store import StateDoc
from ..wiring import Node

PREFIX = "agent_fsm"


def counters(doc: StateDoc) -> Counters:
    """The node's counters, as the state file keeps them (zeros when it has none)."""
    return Counters(**(doc.counters or {}))


@dataclass(frozen=True)
class Sample:
    labels: tuple[tuple[str, str], ...]
    value: float


@dataclass(frozen=True)
class Family:
    name: str  # the full sample name, `_total` included for counters
    type: str  # "gauge" or "counter"
    help: str
    samples: tuple[Sample, ...]


def collect(node: Node) -> tuple[Family, ...]:
    doc = node.store.read()
    now = node.clock.now()
    sig = node.signal()
    agent = ("agent", node.paths.name)
    c = counters(doc)

    def one(name: str, kind: str, text: str, value: float, *labels: tuple[str, str]) -> Family:
        return Family(f"{PREFIX}_{name}", kind, text, (Sample((agent, *labels), value),))

    families = [
        Family(f"{PREFIX}_state", "gauge",
               "The upgrade machine's state: 1 for the current state, 0 for the others.",
               tuple(Sample((agent, ("state", s)), 1.0 if s == doc.state else 0.0)
                     for s in node.definition.state_names)),
        Family(f"{PREFIX}_upgrades_total", "counter",
               "Upgrades judged, by outcome (ok, rolled_back).",
               (Sample((agent, ("outcome", "ok")), c.upgrades_ok),
                Sample((agent, ("outcome", "rolled_back")), c.upgrades_rolled_back))),
        one("rollbacks_total", "counter",
            "Rollbacks completed: the last-good running again after a failed upgrade.",
            c.rollbacks),
        one("upgrade_attempts_total", "counter", "Starts of a candidate being judged.",
            c.attempts),
        one("upgrade_pending", "gauge", "1 while an upgrade is pending (its signal exists).",
            0.0 if sig is None else 1.0),
        one("upgrade_pending_attempt", "gauge",
            "The pending upgrade's attempt (starts of the candidate so far); 0 when none.",
            0.0 if sig is None else float(sig.attempt)),
        one("gate_open", "gauge", "1 when the startup gate is open.",
            1.0 if node.gate.is_open() else 0.0),
        one("owed_effects", "gauge",
            "Effects an interrupted transition still owes (resumed at the next start).",
            0.0 if doc.pending is None else float(len(doc.pending.effects) - doc.pending.done)),
        one("info", "gauge", "The selected and last-good releases, as labels; always 1.", 1.0,
            ("selected", node.releases.selected() or ""),
            ("last_good", node.releases.last_good() or "")),
    ]
    held, found = hold.read(node.paths.hold_file), inhibitors.view(node.paths)
    stale = sum(1 for i in found if i["stale"])
    families.append(one("hold_active", "gauge", "1 while upgrades are held (`agent-fsm hold`, "
                        "not expired).", float(held is not None and not held.expired(now))))
    families.append(Family(f"{PREFIX}_inhibitors", "gauge", "Workloads' inhibitor files, by "
                           "status: active (refusing upgrades) or stale (their PID is gone).",
                           (Sample((agent, ("status", "active")), float(len(found) - stale)),
                            Sample((agent, ("status", "stale")), float(stale)))))
    by_reason = known_bad.rollbacks(node.paths)  # kept with the marks, counted once each
    families.append(Family(f"{PREFIX}_rollbacks_by_reason_total", "counter", "Rollbacks by "
                           "reason_class (check_failed, crashed, deadline, stopped, manual, ...).",
                           tuple(Sample((agent, ("reason_class", k)), float(by_reason.get(k, 0)))
                                 for k in CLASSES if k != ReasonClass.passed)))
    work = workload_state.view(node.paths, node.releases.selected(), "")
    if work is not None:  # none declared: no workload to count
        families.append(one("workload_running", "gauge", "1 while the selected release's "
                            "workload runs (its process and its daemon alive).",
                            float(work["running"])))
        families.append(one("workload_restarts_total", "counter", "Automatic restarts of the "
                            "agent unit before the workload's last start (systemd's NRestarts: "
                            "reset when the unit is started by hand).", float(work["restarts"])))
    families += _channel(node, agent)
    if doc.since is not None:
        families.append(one("state_seconds", "gauge", "Seconds in the current state so far.",
                            max(now - doc.since, 0.0)))
    if doc.last_transition is not None:
        families.append(one("last_transition_timestamp_seconds", "gauge",
                            "When the last transition finished, in seconds since the epoch.",
                            doc.last_transition))
    return tuple(families)


def _channel(node: Node, agent: tuple[str, str]) -> list[Family]:
    """The channel's last follow, when the config names one (`channel` label: its name)."""
    cfg = node.config.channel
    if cfg.url is None:
        return []
    labels = (agent, ("channel", cfg.name))

    def one(name: str, text: str, value: float) -> Family:
        return Family(f"{PREFIX}_channel_{name}", "gauge", text, (Sample(labels, value),))

    try:
        rec = channel_record.read(node.paths.channel_dir)
    except DocumentError:
        rec = None
        damaged = True
    else:
        damaged = False
    failed = damaged or (rec is not None and rec.outcome in (channel_record.Outcome.failed,
                                                              channel_record.Outcome.refused))
    out = [one("last_follow_failed", "1 when the last follow failed or was refused (or its "
               "record is damaged).", float(failed))]
    if rec is None:
        return out
    out.append(Family(f"{PREFIX}_channel_last_follow", "gauge", "The last follow's outcome: 1 "
                      "for it, 0 for the others.",
                      tuple(Sample((*labels, ("outcome", o.value)), float(o is rec.outcome))
                            for o in channel_record.Outcome)))
    out.append(one("last_follow_timestamp_seconds", "When the last follow ran, in seconds since "
                   "the epoch.", rec.time))
    out.append(one("root_version", "The newest root of the channel this node believes.",
                   float(rec.root_version)))
    if rec.seen is not None:
        out.append(one("index_version", "The newest index of the channel this node believed.",
                       float(rec.seen.version)))
    return out


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _value(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def exposition(families: Sequence[Family]) -> str:
    """Prometheus text format 0.0.4."""
    lines = []
    for f in families:
        lines.append(f"# HELP {f.name} {f.help.replace(chr(92), chr(92) * 2)}")
        lines.append(f"# TYPE {f.name} {f.type}")
        for s in f.samples:
            labels = ",".join(f'{k}="{_label(v)}"' for k, v in s.labels)
            lines.append(f"{f.name}{{{labels}}} {_value(s.value)}")
    return "\n".join(lines) + "\n"
