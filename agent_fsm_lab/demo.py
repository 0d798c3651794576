"""The demo (`make demo`): `try` with the lab's own releases, in about half a minute.

Packs three releases, then does what `python -m agent_fsm_lab try` does with them: installs
1.0.0, upgrades to a good 2.0.0, then to a 3.0.0 that crashes at start and ships broken assets
(the node rolls back to 2.0.0 through 2.0.0's own held units and script, byte for byte), then
proves the way back once more with 1.0.0 killed at each start. Reports each step through a
callback and returns the timeline and final status.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent_fsm.errors import AgentFsmError

from .lab import Lab
from .sandbox import SystemdSandbox, missing_requirements, python_paths
from .trying import Verdict, drive, lab_errors


@dataclass(frozen=True)
class DemoResult:
    timeline: list[dict[str, Any]]
    status: dict[str, Any]
    assets_kept: bool


def run(say: Callable[[str], None]) -> DemoResult:
    missing = missing_requirements()
    if missing:
        raise AgentFsmError("the demo boots a private systemd and needs " + "; ".join(missing))
    with lab_errors(say), SystemdSandbox(keep=python_paths()) as sb:
        lab = Lab(sb, soak=1)
        packs = [lab.pack(version, kind, add=False)  # type: ignore[arg-type]
                 for version, kind in (("1.0.0", "good"), ("2.0.0", "good"), ("3.0.0", "crash"))]
        say("packed 1.0.0 and 2.0.0 (good) and 3.0.0 (crashes at start, ships broken assets)")
        seen: dict[str, Any] = {}

        def judged(v: Verdict) -> None:
            if v.version == "2.0.0":
                if v.outcome != "ok":
                    raise AgentFsmError(f"the good upgrade did not converge: {v}")
                seen["good"] = lab.assets()
            elif v.version == "3.0.0":
                if v.exit_code != 4:
                    raise AgentFsmError(f"the broken upgrade did not roll back: {v}")
                seen["kept"] = lab.assets() == seen["good"]
                say("2.0.0's units and recovery script are byte for byte as before the broken "
                    "upgrade" if seen["kept"] else "2.0.0's assets CHANGED during the broken upgrade")

        tried = drive(lab, packs, say, judged)
        return DemoResult(tried.timeline, tried.status, bool(seen.get("kept")))
