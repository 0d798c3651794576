"""Whether a candidate's attempt ended by systemd's start timeout, as the start check sees it.

In a restart's `ExecStartPre=`, systemd has forgotten the attempt before (`Result=success`,
`ExecMain*=0`, on 252 and 257). So the start check keeps its own record in the signal when it lets a
start go on. It records `NRestarts`, and a time on systemd's monotonic clock: when
`TimeoutStartSec=` would end the attempt, had it never sent READY=1, plus the restart delay
(`RestartUSecNext`, else `RestartUSec`). At the next start, the attempt timed out if systemd
restarted it itself (`NRestarts` one more) no sooner than that. A stop or reboot between resets
`NRestarts`: never a timeout. A crash later than the start timeout, less the check's run and the
stop, counts as one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..node.runtime.signal import UpgradeSignal
from ..node.state.validate import MAX_TIME

PROPERTIES = ("NRestarts", "SubState", "StateChangeTimestampMonotonic", "TimeoutStartUSec",
              "RestartUSec", "RestartUSecNext")
# The units of systemd's time spans, as `systemctl show` prints them ("1min 30s", "200ms").
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0,
          "w": 604800.0, "M": 2629800.0, "y": 31557600.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s|min|h|d|w|M|y)")


def span(text: str | None) -> float | None:
    """Seconds of a time span as `systemctl show` prints it; None for "infinity", nothing, or
    anything else."""
    words = (text or "").split()
    if not words or not all(_PART.fullmatch(w) for w in words):
        return None
    return sum(float(m[1]) * _UNITS[m[2]] for m in (_PART.fullmatch(w) for w in words) if m)


def _number(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def _now(shown: Mapping[str, str]) -> float | None:
    """When this start's `ExecStartPre=` began, in seconds of systemd's monotonic clock."""
    usec = _number(shown.get("StateChangeTimestampMonotonic"))
    return usec / 1e6 if usec and shown.get("SubState") == "start-pre" else None


def timed_out(sig: UpgradeSignal, shown: Mapping[str, str]) -> bool:
    """Whether the attempt the start check let go last (its record in `sig`) ended by the start
    timeout, from this start's `shown` properties."""
    now, restarts = _now(shown), _number(shown.get("NRestarts"))
    if sig.timed_out_by is None or sig.unit_restarts is None or now is None:
        return False
    return restarts == sig.unit_restarts + 1 and now >= sig.timed_out_by


def counted(sig: UpgradeSignal, shown: Mapping[str, str], most: int) -> dict[str, Any]:
    """The signal's fields for this start, the next after `sig`'s, of at most `most` let go.

    `timeouts`: the attempts in a row the start timeout ended, up to the last. The record of this
    start when it goes on; none when refused, since a refused start is no attempt and the refused
    starts after it keep the count.
    """
    timeouts = 0
    if sig.starts > most:  # the start before was refused: nothing ran since
        timeouts = sig.timeouts
    elif timed_out(sig, shown):
        timeouts = sig.timeouts + 1
    now, restarts = _now(shown), _number(shown.get("NRestarts"))
    timeout = span(shown.get("TimeoutStartUSec"))
    delay = span(shown.get("RestartUSecNext")) or span(shown.get("RestartUSec")) or 0.0
    by = None if now is None or timeout is None else now + timeout + delay
    if sig.starts + 1 > most or restarts is None or by is None or not by <= MAX_TIME:
        # Never a value the signal's readers refuse: that would lose the signal.
        return {"timeouts": timeouts, "timed_out_by": None, "unit_restarts": None}
    return {"timeouts": timeouts, "timed_out_by": by, "unit_restarts": restarts}
