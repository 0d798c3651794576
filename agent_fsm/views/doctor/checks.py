"""`agent-fsm doctor`: check the host and say what to do about each finding."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from ... import files
from ...errors import AgentFsmError, SystemdError
from ...machine.vocabulary import StateName, Trigger
from ...node.assets import bin_link
from ...node.config import own_directories
from ...node.records import hook_failures, known_good
from ...node.releases.pointers import read_manifest
from ...node.state import validate
from ...node.state.store import OWED_CHECK_SECONDS
from ...system import proc, unit_state
from ...system import workload as workload_proc
from ...system.systemd import Systemctl
from ...wiring import Node
from ..status import units as unit_view
from . import config_modes, modes, stored
from .finding import Finding, Level
from .signatures import signatures

__all__ = ["Finding", "Level", "doctor"]
REMOTE_FS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "fuse.sshfs", "9p", "afs", "ceph",
             "glusterfs", "lustre"}


def _systemd_version(prefix: tuple[str, ...]) -> Finding:
    if shutil.which(prefix[0]) is None:
        return Finding("systemd", "fail", f"{prefix[0]} (the config's `systemctl`) is not on PATH",
                       "install systemd, or set `systemctl` in the config")
    try:
        version = Systemctl(prefix).version()  # as the daemon asks it
    except SystemdError as exc:
        return Finding("systemd", "warn", f"could not read the version: {exc}")
    if version < 249:
        return Finding("systemd", "warn", f"systemd {version} is older than 249, the oldest tested",
                       "recovery semantics were checked on 249 to 255")
    return Finding("systemd", "ok", f"systemd {version}")


def _root_config(node: Node) -> list[Finding]:
    """Under --root, the units name a config read from outside the root as it is: the host must have
    the same file at that path."""
    source = node.config.source
    if node.paths.root is None or source is None or node.paths.host_view(source) is not None:
        return []
    return [Finding("config path", "warn", f"{source} is not below --root {node.paths.root}: the "
                    f"units name it as {source}, a path on the host",
                    f"pass the host's own file, e.g. --config {node.paths.root}/etc/agent-fsm/"
                    "config.toml, or make sure the host has the same file there")]


def _units_verify(node: Node) -> Finding:
    if node.paths.root is not None:
        return Finding("units", "warn", "not verified under --root: the units name host paths "
                       "that exist only on the host")
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        return Finding("units", "warn", "systemd-analyze is not installed; units not verified")
    try:
        rendered = node.effectors.rendered()
    except AgentFsmError as exc:
        return Finding("units", "warn", f"cannot render the selected release's assets: {exc}")
    with files.private_dir(prefix="agent-fsm-doctor.") as tmp:
        names = []
        for a in rendered:
            if a.host_path.suffix == ".service":
                (tmp / a.host_path.name).write_bytes(a.content)
                names.append(a.host_path.name)
        done = proc.run([analyze, "verify", "--man=no", *names], timeout=None, cwd=tmp)
    if done.returncode != 0 or done.stderr.strip():
        first = (done.stderr.strip().splitlines() or ["exit " + str(done.returncode)])[0]
        return Finding("units", "fail", f"rendered units do not verify cleanly: {first}",
                       "fix the release's assets/ templates")
    return Finding("units", "ok", "rendered units verify with systemd-analyze, no warnings")


def _fs_type(path: Path) -> str | None:
    best, fstype = "", None
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    resolved = str(path.resolve())
    for line in mounts:
        parts = line.split()
        mnt = parts[1].replace("\\040", " ")
        if (resolved == mnt or resolved.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
            best, fstype = mnt, parts[2]
    return fstype


def _directories(node: Node) -> list[Finding]:
    """Modes, owners and links (`modes`), and a lock that locks."""
    paths = node.paths
    out = modes.state_dir(paths) + modes.assets(paths) + config_modes.config_file(paths)
    fstype = _fs_type(paths.state_dir if paths.state_dir.exists() else paths.state_dir.parent)
    if fstype in REMOTE_FS:
        out.append(Finding("lock", "fail", f"{paths.lock_file} is on a {fstype} filesystem, where "
                           "file locks are not reliable", "put state_dir on a local filesystem"))
    else:
        out.append(Finding("lock", "ok", f"state directory on a local filesystem ({fstype})"))
    return out


def _damaged_signal_fix(node: Node, state: str) -> str:
    """The way out of an unreadable signal, which never lets an unjudged candidate in."""
    sig, unit = node.paths.signal_file, node.paths.agent_unit_name
    if state in node.groups.recover_from:
        return "roll back with `agent-fsm recover` (it does not need the signal)"
    selected, last_good = node.releases.selected(), node.releases.last_good()
    if selected is not None and selected == last_good:
        return (f"the node runs its last-good {last_good}: move the signal aside (`mv {sig} "
                f"{sig}.damaged`) and `systemctl restart {unit}`")
    return (f"{selected} is selected but the last-good is {last_good}: `systemctl stop {unit}`, "
            f"move the signal aside (`mv {sig} {sig}.damaged`), then `agent-fsm activate --to "
            f"{last_good}`")


def _consistency(node: Node) -> list[Finding]:
    try:
        doc = node.store.read()
    except AgentFsmError as exc:
        return [Finding("state file", "fail", str(exc),
                        "restore it from a backup, or move it aside to start from idle")]
    out = [Finding("state file", "ok", f"{node.paths.state_file} is valid ({doc.state})")]
    try:
        sig = node.signal()
    except AgentFsmError as exc:
        return [*out, Finding("signal", "fail", str(exc), _damaged_signal_fix(node, doc.state))]
    gate = node.gate.is_open()
    pending = node.groups.pending
    if doc.pending is not None:
        operators = node.definition.finished_for_a_dead_command(doc.pending.trigger,
                                                                doc.pending.args)
        in_place = doc.pending.trigger == Trigger.begin_upgrade \
            and node.releases.selected() == node.releases.last_good()
        how = (f"abandons it within {OWED_CHECK_SECONDS:g}s, its workload left running"
               if in_place else f"restarts {node.paths.agent_unit_name} within "
               f"{OWED_CHECK_SECONDS:g}s to finish it")
        out.append(Finding("owed effects", "warn",
                           f"{doc.pending.trigger} stopped after {doc.pending.done} of "
                           f"{len(doc.pending.effects)} effects",
                           f"an operator's command that died: the running agent {how} (so "
                           "does the next agent-fsm operation or start)"
                           if operators else
                           "the next start of the agent resumes it (or `agent-fsm recover`)"))
    if doc.state in pending and sig is None and doc.pending is None \
            and doc.state != StateName.judged_ok:
        out.append(Finding("signal", "fail", f"state {doc.state} but no upgrade signal",
                           "run `agent-fsm recover` to return to the last-good"))
    elif doc.state not in pending and sig is not None and doc.pending is None:
        out.append(Finding("signal", "fail",
                           f"an upgrade signal ({sig.from_version} → {sig.to_version}) exists but "
                           f"the state is {doc.state}",
                           "run `agent-fsm recover`: the candidate was never judged here, so the "
                           "node rolls back to the last-good (never remove the signal by hand: "
                           "the next start would accept the unjudged candidate)"))
    else:
        out.append(Finding("signal", "ok", "signal consistent with the state"))
    if gate and (sig is not None or doc.state != StateName.converged):
        out.append(Finding("gate", "fail", f"the gate is open in state {doc.state}"
                           + (" with an upgrade signal" if sig else ""),
                           "restart the agent unit: the daemon opens the gate when it may"))
    else:
        out.append(Finding("gate", "ok", f"gate {'open' if gate else 'closed'} in state {doc.state}"))
    if sig is None and doc.state == StateName.converged:
        try:
            differ = [str(a.path) for a in node.effectors.rendered() if not a.matches_disk()]
        except AgentFsmError as exc:  # a damaged release: its own finding (`release`) says so
            out.append(Finding("assets", "warn", f"not compared with the selected release: {exc}"))
            return out
        if differ:
            out.append(Finding("assets", "warn", f"differ from the selected release: "
                               f"{', '.join(differ)}", "the next start of the agent rewrites them"))
        else:
            out.append(Finding("assets", "ok", "the selected release's assets are on disk"))
    return out


def _bin_link(node: Node) -> list[Finding]:
    """`agent-fsm` on PATH (the config's `bin_link`): agent-fsm's link to the selected release's
    launcher, missing, pointing elsewhere, or replaced by something else."""
    link = bin_link.look(node.paths)
    if link.state == "missing" and node.releases.selected() is None:
        return []  # nothing installed yet: `install` writes it
    level: Level = "ok" if link.state in ("ok", "none") else "warn"
    return [Finding("link on PATH", level, link.detail(), link.fix())]


def _follow_timer(node: Node) -> list[Finding]:
    """With a `[channel] url`: whether the follow timer's files are there and systemd runs it."""
    if node.config.channel.url is None or node.releases.selected() is None:
        return []
    timer = node.paths.follow_timer_name
    missing = [p for p in (node.paths.follow_timer, node.paths.follow_service) if not p.exists()]
    if missing:
        return [Finding("follow timer", "warn", f"{', '.join(map(str, missing))} missing: the "
                        "channel is not followed by itself", "the next install or start of the "
                        f"agent writes it (`systemctl restart {node.paths.agent_unit_name}`)")]
    try:
        active, enabled, at = unit_state.timer(node.config.systemctl, timer)
    except unit_state.Unread as exc:
        return [Finding("follow timer", "warn", f"{timer}: state unknown: {exc.reason}")]
    if active != "active" or enabled != "enabled":
        return [Finding("follow timer", "warn", f"{timer} is {active} and {enabled or 'unknown'}:"
                        " the channel is not followed by itself",
                        f"systemctl enable --now {timer}")]
    when = "" if at is None else \
        f", next run {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(at))}"
    return [Finding("follow timer", "ok", f"{timer} active ({node.config.channel.window}){when}")]


def _outbox(node: Node) -> list[Finding]:
    """Queued results that delivery refuses, checked as `system.publish` checks them."""
    try:
        queued = sorted(p for p in node.paths.outbox_dir.iterdir() if p.suffix == ".json")
    except FileNotFoundError:
        return []
    except OSError as exc:
        return [Finding("outbox", "fail", f"cannot list {node.paths.outbox_dir}: {exc}")]
    out = []
    for path in queued:
        try:
            validate.result_file(path.read_bytes())
        except (OSError, ValueError) as exc:
            out.append(Finding("outbox", "fail", f"queued result {path}: {exc}",
                               "correct it or move it aside: delivery stops at it"))
    return out


def _skipped(node: Node) -> list[Finding]:
    """Effects allowed to fail that did, since the latest install, upgrade or rollback."""
    try:
        doc = node.store.read()
    except AgentFsmError:
        return []  # reported by the state file's own finding
    unit = node.paths.agent_unit_name
    return [Finding(
        "skipped effect", "warn",
        f"{s['effect']} failed during {s['trigger']} and was let pass: {s['error']}",
        f"run `systemctl reset-failed {unit}` when you can: until then, once StartLimitBurst "
        f"starts fall within StartLimitIntervalSec systemd refuses the next start"
        if s["effect"] == "reset_start_limit" else
        "the next start of the agent writes and reloads again; see its journal")
        for s in doc.skipped]


def _hooks(node: Node) -> list[Finding]:
    """`after` hooks whose last run failed (kept until they next succeed)."""
    return [Finding("hook", "warn", f"after hook {key.partition('.')[2]} last failed: {v['error']}",
                    "fix the hook; it runs again at its next transition (`agent-fsm status` "
                    "lists the hooks), and the warning goes when it succeeds")
            for key, v in sorted(hook_failures.read(node.paths.state_dir).items())]


def _journal(node: Node) -> list[Finding]:
    """Lines of the history journal that `history` skips (damaged: a checksum or a field)."""
    try:
        doc = node.store.read()
    except AgentFsmError:
        return []  # reported by the state file's own finding
    try:
        read = node.store.read_journal(doc)
    except AgentFsmError as exc:
        return [Finding("history", "fail", str(exc))]
    path = node.store.journal.path
    if not read.damaged:
        return []
    listed = "; ".join(f"line {d.line} {d.why}" for d in read.damaged[:5])
    more = f" (and {len(read.damaged) - 5} more)" if len(read.damaged) > 5 else ""
    return [Finding("history", "warn",
                    f"{path}: {len(read.damaged)} damaged line(s) skipped by `agent-fsm "
                    f"history`: {listed}{more}",
                    "nothing to do for the upgrade machine (the state file is what counts); copy "
                    "the file aside if you want to inspect it: the next rotation drops them")]


def _units_now(node: Node, prog: str) -> list[Finding]:
    """What the units and the state dir's file system say now, as `status` reads them: a failed
    unit, a rollback systemd retries, a failing write, each with what to do."""
    units = unit_view.read(node)
    if units.error is not None:
        return [Finding("units now", "warn", f"unit state unknown: {units.error}")]
    try:
        doc = node.store.read()
    except AgentFsmError:
        return []  # the state file's own finding says why
    advice = unit_view.advise(units, node, doc, prog)
    if advice is None:
        return [Finding("units now", "ok", "; ".join(
            f"{u.unit} {u.words()}" for u in (units.agent, units.recovery) if u is not None))]
    level: Level = "warn" if advice.kind == "recovery_retrying" else "fail"
    fix = advice.next.summary + "".join(f"; {c}" for c in advice.next.commands)
    return [Finding("units now", level, advice.situation, fix)]


def _workload(node: Node) -> list[Finding]:
    """Who the selected release's workload runs as ([workload] user, group), and whether the
    writable paths it is granted exist."""
    selected = node.releases.selected()
    if selected is None:
        return []
    try:
        command = read_manifest(node.paths.selected / "release.toml").workload
    except (OSError, AgentFsmError):
        return []  # the release's own findings say why
    if not command:
        return [Finding("workload", "ok", f"release {selected} declares no workload")]
    settings = node.config.workload
    try:
        who = workload_proc.account(settings.user, settings.group, f"config {node.config.source}")
    except AgentFsmError as exc:
        return [Finding("workload", "fail", str(exc), "the daemon cannot start the workload "
                        "until the account exists or the config names another")]
    out = []
    if settings.user is None and who.uid == 0:
        out.append(Finding("workload", "warn", "the workload runs as root (the default)",
                           "set `[workload] user` (and `writable_paths`) to run it as its own "
                           "account"))
    else:
        out.append(Finding("workload", "ok", f"the workload runs as {who.words()}"))
    kept = tuple(d for _, d in own_directories(node.config))
    for path in settings.writable_paths:
        inside = next((d for d in kept if path == d or d in path.parents), None)
        if inside is not None:
            out.append(Finding("workload", "warn", f"writable path {path} is inside agent-fsm's "
                               f"{inside}, which the workload sees read-only whatever its user",
                               "give the workload a directory of its own outside agent-fsm's"))
        elif not node.paths.real(path).exists():
            out.append(Finding("workload", "warn", f"writable path {path} does not exist: the "
                               "unit skips it", f"mkdir -p {path} && chown {who.name} {path}"))
    return out


def _way_back(node: Node) -> list[Finding]:
    """What the way back last did to a damaged last-good, while that release is still damaged
    (`records.known_good`)."""
    event = known_good.read_or_empty(node.paths.known_good_file).way_back
    if event is None or not node.releases.exists(event.release):
        return []
    problem = node.releases.integrity(event.release).problem
    if problem is None:
        return []
    return [Finding("way back", "warn", event.words(),
                    f"add release {event.release} again (`agent-fsm release add DIR`), or "
                    f"`agent-fsm release prune {event.release}` if nothing needs it")]


def doctor(node: Node, *, check_systemd: bool = True, prog: str = "agent-fsm") -> list[Finding]:
    findings: list[Finding] = []
    if check_systemd:
        findings.append(_systemd_version(node.config.systemctl))
        findings += _units_now(node, prog)
    findings += _root_config(node)
    findings += _directories(node)
    findings += _consistency(node)
    findings += _bin_link(node)
    if check_systemd:
        findings += _follow_timer(node)
    findings += stored.releases(node)
    findings.append(stored.store(node))
    findings += _way_back(node)
    findings += _skipped(node)
    findings += _hooks(node)
    findings += _journal(node)
    findings += _outbox(node)
    findings += signatures(node)
    if node.releases.selected() is not None:
        findings.append(_units_verify(node))
    findings += _workload(node)
    if os.geteuid() != 0:
        findings.append(Finding("user", "warn", f"running as uid {os.geteuid()}, not root",
                                "the agent writes units and calls systemctl: run as root"))
    return findings
