"""A wall-clock step for one unit: builds clockshift.c (beside this file) into a preload library.

The judgment tests step the agent unit's wall clock as NTP would, leaving its monotonic clock and
its sleeps real; see the C file for what it changes and why libfaketime does not serve here.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("clockshift.c")
ENV = "AGENT_FSM_LAB_CLOCK_SHIFT"  # names the file holding the shift, whole seconds ("+3600")


def missing() -> str | None:
    """What this machine lacks to build the library, or None."""
    return None if shutil.which("cc") else "a C compiler (cc) to build the clock-step library"


def build(dest: Path) -> Path:
    """Compile the library into `dest` (a directory the unit can read) and return its path."""
    out = dest / "clockshift.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror",
                    "-o", str(out), str(SOURCE), "-ldl"], check=True, capture_output=True,
                   timeout=60)
    return out


def dropin(library: Path, shift_file: Path) -> str:
    """The agent unit's drop-in that preloads `library`, its shift read from `shift_file`."""
    return f"[Service]\nEnvironment=LD_PRELOAD={library} {ENV}={shift_file}\n"
