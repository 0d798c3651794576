"""The host's `[channel]` table: the signed channel this node follows, the root of trust it starts
from, and when and how it looks. `<name>-follow.timer` runs `agent-fsm follow`. Without `url` the
node follows no channel and upgrades only when told."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from . import config_values as values
from .config_values import Check, bad

MAX_URL = 2048
MAX_ROOTS = 16  # roots one follow chains through; the rest at the next
_URL_RE = re.compile(r"https://[A-Za-z0-9.\-\[\]:]+(/[A-Za-z0-9._~!$&'()*+,;=:@%/-]*)?")
_CHANNEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}")
_CALENDAR_RE = re.compile(r"[A-Za-z0-9 *,./:~-]{1,200}")


class ChannelConfig(NamedTuple):
    url: str | None = None  # https://…/stable: the directory holding root/, index.json, releases/
    name: str = "stable"  # the channel the index must name
    root: Path = Path("/etc/agent-fsm/channel-root.json")  # the root of trust a node starts from
    ca: Path | None = None  # the CA bundle TLS is checked against; None: the system's
    window: str = "hourly"  # systemd OnCalendar= of the follow timer: the maintenance window
    spread_seconds: float = 900.0  # RandomizedDelaySec=: a fleet does not arrive at once
    timeout_seconds: float = 60.0  # the most one fetch of a root or the index takes, in all
    download_seconds: float = 3600.0  # the most one release's download takes, in all
    machine_id: Path = Path("/etc/machine-id")  # what this node's rollout bucket is drawn from


def url(source: Path, key: str, value: Any) -> str:
    if not isinstance(value, str) or len(value) > MAX_URL or not _URL_RE.fullmatch(value):
        raise bad(source, key, value, "an https:// URL of the channel's directory (no spaces, "
                  "no query)")
    return value.rstrip("/")


def channel(source: Path, key: str, value: Any) -> str:
    if not isinstance(value, str) or not _CHANNEL_RE.fullmatch(value):
        raise bad(source, key, value, "a channel name (letters, digits, '.', '_', '@', '+', '-')")
    return value


def calendar(source: Path, key: str, value: Any) -> str:
    if not isinstance(value, str) or not _CALENDAR_RE.fullmatch(value):
        raise bad(source, key, value, "a systemd calendar expression (OnCalendar=, "
                  "systemd.time(7)): hourly, daily, Mon..Fri 02:00, *-*-* 01,13:00")
    return value


def _text(value: Path | None) -> str | None:
    return None if value is None else str(value)


# (field, check, dump): the [channel] keys, in the order they are checked.
KEYS: tuple[tuple[str, Check, Callable[[Any], Any]], ...] = (
    ("url", url, lambda v: v),
    ("name", channel, lambda v: v),
    ("root", values.path, str),
    ("ca", values.path, _text),
    ("window", calendar, lambda v: v),
    ("spread_seconds", values.number(0, 86400, zero_ok=True), lambda v: v),
    ("timeout_seconds", values.number(0, 3600), lambda v: v),
    ("download_seconds", values.number(0, 7 * 86400), lambda v: v),
    ("machine_id", values.path, str),
)
