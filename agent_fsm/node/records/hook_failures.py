"""The last failure of each `after` hook, kept in `<state_dir>/hook-failures.json` until its next
success, so that `status` shows a failed undrain that otherwise only the journal would tell.

Written by whichever process ran the hook (the daemon, `recover`, an operator's command) under
its own small lock, never the writers' lock: recording a hook's end never waits on, nor holds
up, a transition. A damaged file is read as empty and replaced by the next write.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ... import files
from ..hook_config import HookConfig
from ..state import lock

FILE_NAME = "hook-failures.json"
LOCK_NAME = "hook-failures.lock"
SCHEMA = 1
MAX_ERROR = 2000  # characters of a failure kept: its last line, with the hook's argv


def read(state_dir: Path) -> dict[str, dict[str, Any]]:
    """`when.trigger` → {"time", "error"} of its last failure; {} when none, or damaged."""
    try:
        data = json.loads(files.read_regular(state_dir / FILE_NAME, 1 << 20))
    except (OSError, ValueError):  # missing, or damaged: the next write replaces it
        return {}
    failed = data.get("failed") if isinstance(data, dict) and data.get("schema") == SCHEMA else None
    if not isinstance(failed, dict):
        return {}
    return {key: {"time": v["time"], "error": v["error"]} for key, v in failed.items()
            if isinstance(key, str) and isinstance(v, dict) and isinstance(v.get("error"), str)
            and type(v.get("time")) is float and math.isfinite(v["time"])}


def note(state_dir: Path, key: str, time: float, failure: str | None) -> None:
    """Record a hook's end: its failure (kept until it succeeds), or its success (clearing it).
    Raises DiskError, LockTimeout or UnsafePath when the file cannot be written (OSError when
    its lock cannot be opened)."""
    if failure is None and key not in read(state_dir):
        return  # nothing to clear: a succeeding hook writes nothing
    files.ensure_private_dir(state_dir)
    with lock.held(state_dir / LOCK_NAME, timeout=10):
        failed = read(state_dir)
        if failure is None:
            failed.pop(key, None)
        else:
            failed[key] = {"time": float(time), "error": failure[-MAX_ERROR:]}
        body = {"schema": SCHEMA, "failed": dict(sorted(failed.items()))}
        files.atomic_write(state_dir / FILE_NAME, json.dumps(body, indent=1).encode() + b"\n",
                           0o600)


def view(hooks: HookConfig, state_dir: Path) -> tuple[dict[str, Any], ...]:
    """The hooks configured, for `status`: `when`, `trigger`, `argv`, and `failed` (null, or
    the last failure of an `after` hook not since run with success: `time`, `error`)."""
    failed = read(state_dir)
    return tuple({"when": when, "trigger": trigger, "argv": list(argv),
                  "failed": failed.get(f"{when}.{trigger}")}
                 for when, trigger, argv in hooks.listed())
