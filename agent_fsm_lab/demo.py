"""`agent-fsm demo`: the whole story in a private systemd, in about half a minute.

Packs three releases, installs 1.0.0, upgrades to a good 2.0.0, then to a 3.0.0 that crashes at
start and ships broken assets; the node rolls back to 2.0.0 through 2.0.0's own held units and
script. Reports each step through a callback and returns the timeline and final status.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent_fsm.errors import AgentFsmError

from .lab import UNIT, Lab
from .sandbox import SystemdSandbox, missing_requirements, python_paths


@dataclass(frozen=True)
class DemoResult:
    timeline: list[dict[str, Any]]
    status: dict[str, Any]
    assets_kept: bool


def run(say: Callable[[str], None]) -> DemoResult:
    missing = missing_requirements()
    if missing:
        raise AgentFsmError("the demo boots a private systemd and needs " + "; ".join(missing))
    with SystemdSandbox(keep=python_paths()) as sb:
        say(f"booted a private systemd (PID 1 of its own namespaces); node files in {sb.test_dir}")
        lab = Lab(sb, soak=1)
        for version, kind in (("1.0.0", "good"), ("2.0.0", "good"), ("3.0.0", "crash")):
            lab.pack(version, kind)  # type: ignore[arg-type]
        say("packed 1.0.0 and 2.0.0 (good) and 3.0.0 (crashes at start, ships broken assets)")
        lab.install("1.0.0")
        say("installed 1.0.0: all assets written, agent.service active, gate open")

        proc = lab.cli("upgrade", "--to", "2.0.0", "--wait", "--timeout", "120", check=False)
        say(f"$ agent-fsm upgrade --to 2.0.0 --wait   (exit {proc.returncode})\n"
            + proc.stdout.rstrip())
        if proc.returncode != 0:
            raise AgentFsmError("the good upgrade did not converge:\n" + proc.stderr
                                + sb.diagnostics(UNIT))
        good_assets = lab.assets()

        proc = lab.cli("upgrade", "--to", "3.0.0", "--wait", "--timeout", "120", check=False)
        say(f"$ agent-fsm upgrade --to 3.0.0 --wait   (exit {proc.returncode})\n"
            + proc.stdout.rstrip() + ("\n" + proc.stderr.rstrip() if proc.stderr else ""))
        if proc.returncode != 4:
            raise AgentFsmError("the broken upgrade did not roll back:\n" + proc.stderr
                                + sb.diagnostics(UNIT))
        status = lab.settled()
        kept = lab.assets() == good_assets
        say("2.0.0's units and recovery script are byte for byte as before the broken upgrade"
            if kept else "2.0.0's assets CHANGED during the broken upgrade")
        return DemoResult(lab.history(), status, kept)
