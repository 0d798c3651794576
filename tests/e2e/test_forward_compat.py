"""Across versions, end to end in a private systemd 252.

The release is agent-fsm itself, so the candidate is newer code than the last-good, and only the
last-good's code runs the way back. Three checks:

- a real earlier version of this repository (`_earlier_commit`) installed by its own code as the
  last-good, and this working tree as the candidate that fails its judgment: the earlier code
  reads what this one wrote and rolls the node back to converged;
- this version as the last-good and a state file as a later version writes it (a later schema
  through its core, an owed transition it does not know, keys and a counter it does not know):
  recovery supersedes what it cannot run and rolls back, keeping the later keys;
- this version as the last-good and the config made wrong (`deadline_seconds = -1`) while the
  candidate is judged: recovery and the last-good's daemon finish the way back with the settings
  kept at its promotion, `status` says so, operator commands refuse the file; fixed, it is gone.

Every wait is bounded; the recovery unit is started only by systemd (`OnFailure=`), never here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import pytest

from agent_fsm.actions.releases import libcache, packing
from agent_fsm.node.state import store as store_mod
from agent_fsm_lab.lab import RECOVERY_UNIT, UNIT, Lab
from agent_fsm_lab.sandbox import SystemdSandbox

pytestmark = [pytest.mark.e2e]
if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark.append(pytest.mark.timeout(150))  # a safety net only: every wait here is bounded

REPO = Path(__file__).resolve().parents[2]
# A file whose bytes differ between the earlier commit and this tree: proof of whose code ran.
CHANGED = Path("agent_fsm/node/state/document_file.py")


# Read-only git calls on this checkout, whoever owns it (a CI clone may belong to another user).
GIT = ["git", "-c", f"safe.directory={REPO}", "-C", str(REPO)]


def _git(*args: str) -> str:
    return subprocess.run([*GIT, *args], capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()


def _no_history(reason: str) -> NoReturn:
    """Skip, saying why; in CI (CI=true), whose clone has its history, fail instead."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: the cross-version test must not be skipped)",
                    pytrace=False)
    pytest.skip(reason)


# The release before this one: 0.1.0, the compatibility floor (CHANGELOG.md). Moved forward,
# by hand, when a later release is the one the fleet runs as its last-good.
EARLIER = "78dcf8c2fe7f5671b81fece14fb4e2eb443f91b4"


def _earlier_commit() -> str:
    """The earlier version (EARLIER); skipped only where git or its history is missing."""
    if shutil.which("git") is None:
        _no_history("the cross-version test needs git (to take the earlier commit's tree)")
    try:
        if _git("rev-parse", "--is-shallow-repository") == "true":
            _no_history("the checkout is shallow: the earlier commit's tree is not available")
        return _git("rev-parse", "--verify", "--quiet", f"{EARLIER}^{{commit}}")
    except (subprocess.CalledProcessError, OSError) as exc:
        stderr = getattr(exc, "stderr", "") or ""
        _no_history(f"commit {EARLIER[:12]} (the release before this one) is not in this "
                    f"checkout's history: {exc} {stderr.strip()}")


def _earlier_tree(commit: str, into: Path) -> Path:
    """The earlier commit's `agent_fsm` and `states` (the package's definition link), as files."""
    into.mkdir()
    archive = subprocess.run([*GIT, "archive", commit, "agent_fsm", "states"],
                             capture_output=True, check=True, timeout=60).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True, timeout=60)
    return into


def _workload(lab: Lab, healthy: bool) -> str:
    health = lab.health
    return f'/bin/sh -c \'echo "$AGENT_FSM_VERSION" > {health}; exec sleep infinity\'' \
        if healthy else "/bin/sh -c 'exec sleep infinity'"


def _why(lab: Lab) -> str:
    return lab.sb.diagnostics(UNIT, RECOVERY_UNIT)


def _later_body(lab: Lab) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((lab.state_dir / "state.json").read_bytes())
    for key in ("checksum", "kind", "schema"):
        body.pop(key)
    return body


def test_a_candidate_of_this_tree_rolls_back_through_the_earlier_release(
        systemd_sandbox: SystemdSandbox) -> None:
    """The earlier commit's agent-fsm, packed and installed by its own code, is the last-good;
    this tree's, judged failed, is the candidate: the earlier code reads the state the
    candidate wrote and rolls back to converged on the earlier release, `upgrade --wait`
    (the earlier code's) exiting 4."""
    commit = _earlier_commit()
    # The lab's `bin_link`, below its directory: 0.1.0 knows the key, and its install writes the
    # link (the host's /usr/local/bin stays untouched; the session's guard checks it).
    lab = Lab(systemd_sandbox, deadline=3, soak=1)
    earlier = _earlier_tree(commit, lab.dir / "earlier")
    if (earlier / CHANGED).read_bytes() == (REPO / CHANGED).read_bytes():
        pytest.fail(f"{CHANGED} is the same at {commit[:12]} and here: pick another proof file")
    old_env = {**lab.env, "PYTHONPATH": str(earlier)}  # the earlier code, inside the sandbox
    old_pack = lab.packs / "1.0.0"
    subprocess.run([sys.executable, "-m", "agent_fsm", "release", "pack", "--version", "1.0.0",
                    "--output", str(old_pack), "--workload", _workload(lab, True)],
                   env={**old_env, "PATH": "/usr/bin:/bin",  # and the run's own lib/ cache
                        libcache.ENV: os.environ[libcache.ENV]}, cwd=earlier, check=True,
                   capture_output=True, timeout=120)

    def earlier_cli(*args: str, binary: str | None = None,
                    check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        argv = [binary] if binary else [sys.executable, "-m", "agent_fsm"]
        return lab.sb.run(*argv, "--config", str(lab.config), *args, check=check,
                          timeout=timeout, env=old_env)

    earlier_cli("release", "add", str(old_pack))
    earlier_cli("install", "--version", "1.0.0")
    lab.settled()
    node_cli = str(lab.state_dir / "selected" / "bin" / "agent-fsm")  # the earlier release's
    new_pack = packing.pack("2.0.0", lab.packs / "2.0.0", ("/bin/sh", "-c", "exec sleep infinity"))
    earlier_cli("release", "add", str(new_pack), binary=node_cli)
    t0 = time.time()
    proc = earlier_cli("upgrade", "--to", "2.0.0", "--wait", "--timeout", "60", binary=node_cli,
                       check=False, timeout=90)
    assert proc.returncode == 4, proc.stdout + proc.stderr + _why(lab)
    end = lab.settled(timeout=30)
    took = time.time() - t0
    assert (end["selected"], end["last_good"], end["signal"]) == ("1.0.0", "1.0.0", None)
    assert end["last_result"]["to"] == "2.0.0"
    assert end["last_result"]["outcome"] == "rolled_back"
    assert [h["trigger"] for h in lab.history() if h["time"] >= t0][-3:] == \
        ["judge_failed", "recover", "recovered"], _why(lab)
    # The way back was the earlier code's: the held script runs the last-good's binary, whose
    # library is the earlier commit's, and that code reads the node now.
    script = (lab.dir / "lib" / "agent-recovery.sh").read_text()
    assert "Written by agent-fsm 1.0.0" in script and "/last-good/bin/agent-fsm" in script
    stored = lab.state_dir / "releases" / "1.0.0" / "lib" / CHANGED
    assert stored.read_bytes() == (earlier / CHANGED).read_bytes()
    by_earlier = json.loads(earlier_cli("status", "--json", binary=node_cli).stdout)
    assert (by_earlier["state"], by_earlier["selected"]) == ("converged", "1.0.0")
    print(f"rolled back through {commit[:12]} in {took:.1f}s")


def _silent_upgrade(lab: Lab) -> None:
    """Converged on a good 1.0.0 (this tree), then an upgrade to a 2.0.0 that never says
    READY=1: systemd's start timeout judges it (11 s), and it writes nothing meanwhile."""
    lab.pack("1.0.0")
    lab.install("1.0.0")
    lab.pack("2.0.0", "silent")
    lab.cli("upgrade", "--to", "2.0.0", timeout=30)


def test_a_state_file_from_a_later_version_rolls_back(systemd_sandbox: SystemdSandbox) -> None:
    """While a candidate is judged, the state file becomes a later version's (schema 3 with
    core 2, an owed transition of the candidate's path this version does not know, later
    keys and a later counter): recovery supersedes the owed transition, recorded so, and the
    node converges on the last-good with the later keys still in the file."""
    lab = Lab(systemd_sandbox, deadline=1, soak=0, max_attempts=1)
    _silent_upgrade(lab)
    t0 = time.time()
    body = _later_body(lab)
    assert body["state"] == "candidate_running" and body["pending"] is None
    body["pending"] = {"trigger": "judge_slowly", "source": "candidate_running",
                       "dest": "candidate_running", "effects": ["close_gate", "note_progress"],
                       "done": 1, "args": {"started": t0}, "started": t0}
    body["judgment_phase"] = {"soaking": True}
    body["counters"]["slow_judgments"] = 1
    raw = store_mod.KIND._replace(schema=3).encode({**body, "core": 2})
    tmp = lab.state_dir / ".state.json.later"
    tmp.write_bytes(raw)
    tmp.replace(lab.state_dir / "state.json")  # atomically, as a writer would
    end = lab.settled(timeout=60)
    took = time.time() - t0
    assert (end["selected"], end["last_good"], end["signal"]) == ("1.0.0", "1.0.0", None)
    assert end["last_result"]["outcome"] == "rolled_back"
    superseded = [h for h in lab.history() if h.get("superseded_by")]
    assert [(h["trigger"], h["superseded_by"]) for h in superseded] == [("judge_slowly",
                                                                           "recover")]
    assert superseded[0]["unknown"] == ["trigger judge_slowly", "effect note_progress"]
    after = json.loads((lab.state_dir / "state.json").read_bytes())
    assert after["schema"] == 2 and after["judgment_phase"] == {"soaking": True}
    assert after["counters"]["slow_judgments"] == 1
    print(f"rolled back past a later state file in {took:.1f}s")


def test_a_config_wrong_during_recovery_falls_back_to_the_kept_settings(
        systemd_sandbox: SystemdSandbox) -> None:
    """The config made wrong (`deadline_seconds = -1`) while a candidate is judged: recovery and
    the last-good's daemon roll back with the settings kept at its promotion, so the node
    converges on the last-good while the file is still wrong; `status` names the fallback,
    an operator command refuses the file; once it is fixed, `status` shows no fallback."""
    lab = Lab(systemd_sandbox, deadline=1, soak=0, max_attempts=1)
    _silent_upgrade(lab)
    good = lab.config.read_text()
    assert "deadline_seconds = 1\n" in good
    lab.config.write_text(good.replace("deadline_seconds = 1\n", "deadline_seconds = -1\n"))
    t0 = time.time()
    end = lab.settled(timeout=60)
    took = time.time() - t0
    assert (end["selected"], end["last_good"], end["signal"]) == ("1.0.0", "1.0.0", None)
    assert end["last_result"]["outcome"] == "rolled_back"
    fallback = end["config_fallback"]
    assert fallback is not None and fallback["version"] == "1.0.0", end
    assert "`judgment.deadline_seconds` is -1" in fallback["error"]
    for unit in (RECOVERY_UNIT, UNIT):
        assert "the way back goes on with last-good 1.0.0's settings" in lab.sb.journal(unit), \
            _why(lab)
    refused = lab.cli("hold", "--reason", "maintenance", check=False)
    assert refused.returncode == 1 and "`judgment.deadline_seconds` is -1" in refused.stderr
    lab.config.write_text(good)
    assert lab.status()["config_fallback"] is None
    print(f"rolled back with the kept settings in {took:.1f}s")
