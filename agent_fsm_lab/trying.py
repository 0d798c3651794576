"""Your releases on a throwaway node: `python -m agent_fsm_lab try [--config FILE] RELEASE...`.

Boots a private systemd (the host's, 252 on these machines; with `--systemd 257`, the Debian 13
node's tree that `make node257` caches), configures an agent with your config, adds every
release (a directory `release pack` made, or an archive of one), installs the first, upgrades
through the others in order (`upgrade --wait`: each verdict and its reason), then proves the way
back: an upgrade to another of your releases whose every start is killed (SIGKILL) is rolled
back to where the node was. Prints the timeline, then shuts the node down and removes its
directory: nothing of it stays on the host.

Your config is used as it is but for what places the node inside the lab: `name` is `agent`,
and `state_dir`, `lib_dir`, `unit_dir`, `run_dir`, `python` and `bin_link` are the lab's.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_fsm.errors import AgentFsmError

from . import rootfs
from .lab import NAME, UNIT, Lab
from .sandbox import SystemdSandbox, missing_requirements, python_paths

PLACES = ("name", "state_dir", "lib_dir", "unit_dir", "run_dir", "python", "bin_link")


@dataclass(frozen=True)
class Verdict:
    version: str
    exit_code: int
    outcome: str  # "installed", "ok", "rolled_back", or what the node says when neither
    reason: str | None


@dataclass(frozen=True)
class Tried:
    systemd: str
    verdicts: tuple[Verdict, ...]
    way_back: Verdict | None
    kills: int
    timeline: list[dict[str, Any]]
    status: dict[str, Any]


def _key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def _value(v: Any) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    return json.dumps(v)  # strings and numbers: JSON's are TOML's


def toml_text(data: Mapping[str, Any], prefix: str = "") -> str:
    """`data` as TOML: plain keys first (bare, `python` the first of them: a release's launcher
    reads `python = "…"` so), then each table under its dotted name."""
    keys = sorted(data, key=lambda k: k != "python")  # first: before any `{` of a value
    plain = "".join(f"{_key(k)} = {_value(data[k])}\n" for k in keys
                    if not isinstance(data[k], dict))
    tables = "".join(
        f"\n[{prefix}{_key(k)}]\n" + toml_text(v, f"{prefix}{_key(k)}.")
        for k, v in data.items() if isinstance(v, dict))
    return plain + tables


def lab_config(lab: Lab, yours: Path | None) -> str:
    """Your config with the lab's places in it; without one, the lab's own."""
    if yours is None:
        return lab.config.read_text()
    try:
        data = tomllib.loads(yours.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise AgentFsmError(f"cannot read the config {yours}: {exc}") from None
    ours = tomllib.loads(lab.config.read_text())
    data.update({k: ours[k] for k in PLACES if k in ours})
    data["name"] = NAME
    return toml_text(data)


def _added(lab: Lab, release: Path) -> str:
    before = {r["version"] for r in json.loads(lab.cli("release", "list", "--json").stdout)}
    proc = lab.cli("release", "add", str(release), check=False)
    if proc.returncode != 0:
        raise AgentFsmError(f"release add {release} failed (exit {proc.returncode}): "
                            + (proc.stderr.strip() or proc.stdout.strip()))
    after = {r["version"] for r in json.loads(lab.cli("release", "list", "--json").stdout)}
    new = sorted(after - before)
    if len(new) != 1:
        raise AgentFsmError(f"{release} added no new version (stored already: "
                            f"{', '.join(sorted(after))}); give each release once")
    return str(new[0])


def _verdict(lab: Lab, version: str, code: int) -> Verdict:
    last = lab.status().get("last_result") or {}
    outcome = last.get("outcome", "none") if last.get("to") == version else "none"
    return Verdict(version, code, outcome, last.get("reason") if last.get("to") == version
                   else None)


def _wait_budget(lab: Lab) -> float:
    j = tomllib.loads(lab.config.read_text()).get("judgment", {})
    per = float(j.get("deadline_seconds", 60)) + float(j.get("soak_seconds", 30)) + 30
    return per * (int(j.get("max_attempts", 2)) + 1)


def _killed_at_start(lab: Lab, version: str, timeout: float) -> tuple[Verdict, int]:
    """`upgrade --to version --wait --force`, each start of the candidate killed."""
    done: list[int] = []
    worker = threading.Thread(target=lambda: done.append(lab.cli(
        "upgrade", "--to", version, "--wait", "--force", "--timeout", str(int(timeout)),
        check=False, timeout=timeout + 30).returncode), daemon=True)
    worker.start()
    killed: set[int] = set()
    end = time.monotonic() + timeout + 30
    # The node's own files, not `status` (a CLI call of up to a second under load, as long as the
    # soak): an upgrade to `version` is pending while its signal exists and `selected` names it.
    selected, signal_file = lab.state_dir / "selected", lab.state_dir / "upgrade-signal.json"
    while worker.is_alive() and time.monotonic() < end:
        try:
            candidate = Path(os.readlink(selected)).name == version and signal_file.exists()
        except OSError:
            candidate = False
        pid = int(lab.sb.show(UNIT, "MainPID") or 0) if candidate else 0
        if pid and pid not in killed:
            try:
                host = lab.sb.host_pid(pid)
                # the candidate's daemon, not the last-good's still stopping for the restart
                if f"/{version}/lib/".encode() in Path(f"/proc/{host}/cmdline").read_bytes():
                    os.kill(host, signal.SIGKILL)
                    killed.add(pid)
            except (OSError, ValueError, LookupError):  # gone since systemd named it
                pass
        time.sleep(0.05)
    worker.join(5)
    return _verdict(lab, version, done[0] if done else -1), len(killed)


def run(releases: list[Path], config: Path | None, systemd: str,
        say: Callable[[str], None], lab_options: Mapping[str, Any] | None = None) -> Tried:
    """Boot, install, upgrade through, prove the way back, shut down (see the module)."""
    with lab_errors(say):
        return _run(releases, config, systemd, say, lab_options)


@contextlib.contextmanager
def lab_errors(say: Callable[[str], None]) -> Iterator[None]:
    """A command or a wait of the lab's that fails becomes one AgentFsmError saying which (a
    wait's diagnostics said first)."""
    try:
        yield
    except subprocess.CalledProcessError as exc:
        said = (exc.stderr or exc.stdout or "").strip().replace("\n", " ")
        raise AgentFsmError(f"`{' '.join(map(str, exc.cmd[3:]))}` failed on the lab's node "
                            f"(exit {exc.returncode}): {said}") from None
    except AssertionError as exc:  # a wait of the lab's ran out: what the node says, then why
        first, _, rest = str(exc).partition("\n")
        say(rest)
        raise AgentFsmError(f"{first} (the node's status and journals above)") from None
    except subprocess.TimeoutExpired as exc:
        raise AgentFsmError(f"`{' '.join(map(str, exc.cmd))}` did not finish within "
                            f"{exc.timeout:.0f} s on the lab's node") from None


def _run(releases: list[Path], config: Path | None, systemd: str,
         say: Callable[[str], None], lab_options: Mapping[str, Any] | None) -> Tried:
    if not releases:
        raise AgentFsmError("give at least one release (a directory or an archive)")
    for r in releases:
        if not r.exists():
            raise AgentFsmError(f"{r} does not exist")
    missing = missing_requirements()
    if missing:
        raise AgentFsmError("trying releases boots a private systemd and needs "
                            + "; ".join(missing))
    tree = None
    if systemd == "257":
        tree = rootfs.rootfs_dir()
        if not tree.is_dir():
            raise AgentFsmError(f"the Debian 13 node's tree is not in {tree}: run `make node257`")
    with SystemdSandbox(keep=python_paths(), rootfs=tree) as sb:
        lab = Lab(sb, **dict(lab_options or {}))
        lab.config.write_text(lab_config(lab, config))
        return drive(lab, releases, say)


def drive(lab: Lab, releases: list[Path], say: Callable[[str], None],
          judged: Callable[[Verdict], None] = lambda v: None) -> Tried:
    """On `lab`'s booted node: add `releases`, install the first, upgrade through the others
    (`judged` told each verdict once the node settled), prove the way back."""
    sb = lab.sb
    shown = sb.run("systemctl", "--version").stdout.split("\n")[0]
    say(f"booted a private {shown.split(' (')[0]} (PID 1 of its own namespaces) in "
        f"{sb.test_dir}")
    inside = sb.test_dir / "yours"
    inside.mkdir()
    versions = []
    for i, release in enumerate(releases):
        copy = inside / f"{i}-{release.name}"
        if release.is_dir():
            shutil.copytree(release, copy, symlinks=True)
        else:
            shutil.copy2(release, copy)
        versions.append(_added(lab, copy))
    say("added " + ", ".join(versions))
    budget = _wait_budget(lab)
    lab.cli("install", "--version", versions[0])
    lab.settled(timeout=budget)
    verdicts = [Verdict(versions[0], 0, "installed", None)]
    say(f"installed {versions[0]}: converged, gate open")
    for version in versions[1:]:
        code = lab.cli("upgrade", "--to", version, "--wait", "--timeout", str(int(budget)),
                       check=False, timeout=budget + 30).returncode
        v = _verdict(lab, version, code)
        verdicts.append(v)
        say(f"upgrade --to {version} --wait: exit {code}, "
            + (v.reason or v.outcome.replace("_", " ")))
        lab.settled(timeout=budget)
        judged(v)
    way_back, kills = None, 0
    current = lab.status()["selected"]
    others = [v.version for v in verdicts if v.version != current]
    judged_ok = [v for v in others if v not in {x.version for x in verdicts
                                                 if x.outcome == "rolled_back"}]
    if others:
        target = (judged_ok or others)[-1]
        way_back, kills = _killed_at_start(lab, target, budget)
        back = lab.settled(timeout=budget)
        say(f"way back: {target} killed at each of its {kills} start(s): exit "
            f"{way_back.exit_code}, {way_back.outcome.replace('_', ' ')}, the node back on "
            f"{back['selected']}")
    else:
        say("way back: not proven (one release; give two to see a candidate rolled back)")
    return Tried(shown, tuple(verdicts), way_back, kills, lab.history(), lab.status())
