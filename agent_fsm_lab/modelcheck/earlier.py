"""`state-file-reads` by the previous release: every distinct state file (and signal) the check
reached, read by the earlier commit's reader (the release before this one, as
tests/e2e/test_forward_compat.py names it), in one process of that code. Reader-only: its
`open_reader(...).store.read()` and `.signal()`, nothing written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FORWARD_COMPAT = REPO / "tests" / "e2e" / "test_forward_compat.py"

_READ = r"""
import json, sys
from pathlib import Path
from agent_fsm.node.config import Config
from agent_fsm.wiring import open_reader
out = {}
for d in sys.argv[1:]:
    try:
        r = open_reader(Config(name="agent"), Path(d))
        r.store.read()
        r.signal()
        out[d] = None
    except Exception as exc:
        out[d] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def earlier_commit() -> str | None:
    m = re.search(r'^EARLIER = "([0-9a-f]{40})"', FORWARD_COMPAT.read_text(), re.M)
    return m.group(1) if m else None


def unreadable(files: Iterable[tuple[bytes, bytes | None]], state_rel: str,
               signal_rel: str) -> tuple[str | None, dict[str, str]]:
    """Read each (state file, signal) pair with the earlier commit's code. Returns (why it could
    not be checked, or None; {which pair: the earlier reader's error})."""
    commit = earlier_commit()
    if commit is None:
        return "no earlier commit named in tests/e2e/test_forward_compat.py", {}
    git = ["git", "-c", f"safe.directory={REPO}", "-C", str(REPO)]
    with tempfile.TemporaryDirectory(prefix="agent-fsm-earlier-") as tmp:
        tree = Path(tmp) / "code"
        tree.mkdir()
        try:
            archive = subprocess.run([*git, "archive", commit, "agent_fsm", "states"],
                                     capture_output=True, check=True, timeout=60).stdout
            subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True,
                           timeout=60)
        except (OSError, subprocess.SubprocessError) as exc:
            return f"the earlier commit {commit[:12]} is not available: {exc}", {}
        dirs = []
        for i, (state, sig) in enumerate(files):
            root = Path(tmp) / f"n{i}"
            (root / state_rel).parent.mkdir(parents=True)
            (root / state_rel).write_bytes(state)
            os.chmod((root / state_rel).parent, 0o700)
            if sig is not None:
                (root / signal_rel).write_bytes(sig)
            dirs.append(str(root))
        if not dirs:
            return None, {}
        done = subprocess.run([sys.executable, "-c", _READ, *dirs], capture_output=True,
                              text=True, timeout=600, cwd=tree,
                              env={**os.environ, "PYTHONPATH": str(tree)})
        if done.returncode != 0:
            return f"the earlier reader did not run: {done.stderr.strip()[-500:]}", {}
        errors = json.loads(done.stdout)
        return None, {d: e for d, e in errors.items() if e}
