"""The host's `[judgment] checks`: what must pass before a candidate is judged healthy.

Each item is a command (an argv, its first word an absolute path, as for hooks) that passes on
exit 0, or an HTTP(S) check, a table `{ http = URL, status = 200, timeout_seconds = 5 }` that
passes when a GET of URL answers `status` within its timeout (run in-process by
`system.http_probe`). Every key is checked here, when the config is loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from ..errors import ConfigError
from ..untrusted import control_character
from .config_values import bad, number
from .hook_config import absolute_argv

DEFAULT_STATUS = 200
DEFAULT_TIMEOUT = 5.0
MAX_TIMEOUT = 3600.0  # an hour; the judgment's deadline bounds a check's run anyway
MAX_URL = 2048
_HTTP_KEYS = ("http", "status", "timeout_seconds")
_TIMEOUT = number(0, MAX_TIMEOUT)


class HttpCheck(NamedTuple):
    """A GET of `url` that passes when it answers `status` within `timeout_seconds`. (A
    NamedTuple, as the rest of the config: `status` never imports dataclasses.)"""

    url: str
    status: int = DEFAULT_STATUS
    timeout_seconds: float = DEFAULT_TIMEOUT

    def to_table(self) -> dict[str, Any]:
        return {"http": self.url, "status": self.status, "timeout_seconds": self.timeout_seconds}


# One of the judgment's checks: a command's argv, or an HTTP(S) check.
Check = tuple[str, ...] | HttpCheck


def _url(source: Path, key: str, value: Any) -> str:
    expected = ('an http:// or https:// URL with a host, e.g. "http://127.0.0.1:8080/healthz"')
    if not isinstance(value, str) or not value.lower().startswith(("http://", "https://")) \
            or len(value) > MAX_URL or control_character(value) is not None \
            or any(ch.isspace() for ch in value):
        raise bad(source, key, value, expected)
    from urllib.parse import urlsplit  # here: only a config with an HTTP check needs it

    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port that is not one
    except ValueError:
        raise bad(source, key, value, expected) from None
    if not parts.hostname:
        raise bad(source, key, value, expected)
    return value


def _http(source: Path, key: str, table: dict[str, Any]) -> HttpCheck:
    unknown = sorted(set(table) - set(_HTTP_KEYS))
    if unknown:
        names = ", ".join(f"`{key}.{k}`" for k in unknown)
        raise ConfigError(f"config {source}: unknown key {names}; known keys of an HTTP check: "
                          f"{', '.join(_HTTP_KEYS)}")
    if "http" not in table:
        raise ConfigError(f"config {source}: `{key}` has no `http`; an HTTP check is "
                          '{ http = "http://127.0.0.1:8080/healthz", status = 200, '
                          "timeout_seconds = 5 }")
    url = _url(source, f"{key}.http", table["http"])
    status = table.get("status", DEFAULT_STATUS)
    if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
        raise bad(source, f"{key}.status", status, "an HTTP status code from 100 to 599")
    timeout = _TIMEOUT(source, f"{key}.timeout_seconds", table.get("timeout_seconds",
                                                                  DEFAULT_TIMEOUT))
    return HttpCheck(url, status, timeout)


def parse(source: Path, checks: Any) -> tuple[Check, ...]:
    """Check `[judgment] checks`: a list of argv lists and HTTP check tables."""
    if not isinstance(checks, list):
        raise bad(source, "judgment.checks", checks, "a list of argv lists and HTTP check "
                  "tables")
    out: list[Check] = []
    for i, item in enumerate(checks):
        key = f"judgment.checks[{i}]"
        if isinstance(item, dict):
            out.append(_http(source, key, item))
        else:
            out.append(absolute_argv(source, key, item,
                                     '["/usr/bin/curl", "-fsS", "http://127.0.0.1:8080/healthz"]'
                                     ' or { http = "http://127.0.0.1:8080/healthz" }'))
    return tuple(out)


def to_table(checks: tuple[Check, ...]) -> list[Any]:
    """The checks as `parse` reads them back (what is kept with the last-good)."""
    return [c.to_table() if isinstance(c, HttpCheck) else list(c) for c in checks]
