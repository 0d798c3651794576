"""The last failure of each `after` hook, kept in `<state_dir>/hook-failures.json` until its next
success, so `status` shows a failed undrain that only the journal would tell otherwise.

Whichever process ran the hook (the daemon, `recover`, an operator's command) writes it under a
small lock of its own, never the writers' lock. So recording a hook's end never waits on, nor holds
up, a transition. A damaged file (refused by `document_file`, kind `hook-failures`) reads as empty
and the next write replaces it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ... import files
from ...errors import DocumentError
from ..hook_config import HookConfig
from ..state import lock, validate
from ..state.document_file import Kind

FILE_NAME = "hook-failures.json"
LOCK_NAME = "hook-failures.lock"
SCHEMA = 1
MAX_ERROR = 2000  # characters of a failure kept: its last line, with the hook's argv


def _check(data: dict[str, Any], schema: int) -> None:
    for key, v in validate.obj(data.get("failed", validate.MISSING), "failed").items():
        failure = validate.obj(v, f"failed.{key}")
        validate.time(failure.get("time", validate.MISSING), f"failed.{key}.time")
        if not isinstance(failure.get("error"), str):
            raise validate.invalid(f"failed.{key}.error", failure.get("error", validate.MISSING),
                                   "a string")


KIND = Kind("hook-failures", "hook failures file", "the record", SCHEMA, _check, 1 << 20, 0o600)


def read(state_dir: Path) -> dict[str, dict[str, Any]]:
    """`when.trigger` → {"time", "error"} of its last failure; {} when none, or damaged."""
    try:
        data = KIND.read(state_dir / FILE_NAME)
    except DocumentError:  # damaged: the next write replaces it
        return {}
    if data is None:
        return {}
    return {key: {"time": float(v["time"]), "error": v["error"]}
            for key, v in data["failed"].items()}


def note(state_dir: Path, key: str, time: float, failure: str | None) -> None:
    """Record a hook's end: its failure (kept until it succeeds), or its success (clearing it).
    Raises DiskError, LockTimeout or UnsafePath when the file or its lock cannot be written."""
    if failure is None and key not in read(state_dir):
        return  # nothing to clear: a succeeding hook writes nothing
    files.ensure_private_dir(state_dir)
    with lock.held(state_dir / LOCK_NAME, timeout=10):
        failed = read(state_dir)
        if failure is None:
            failed.pop(key, None)
        else:
            failed[key] = {"time": float(time), "error": failure[-MAX_ERROR:]}
        KIND.write(state_dir / FILE_NAME, {"failed": dict(sorted(failed.items()))})


def view(hooks: HookConfig, state_dir: Path) -> tuple[dict[str, Any], ...]:
    """The hooks configured, for `status`: `when`, `trigger`, `argv`, and `failed`. `failed` is
    null, or the last failure (`time`, `error`) of an `after` hook not run with success since."""
    failed = read(state_dir)
    return tuple({"when": when, "trigger": trigger, "argv": list(argv),
                  "failed": failed.get(f"{when}.{trigger}")}
                 for when, trigger, argv in hooks.listed())
