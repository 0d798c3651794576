"""The host's `[hooks]` table: which command runs before or after which transition, and how long
each may take. The trigger names are checked against the definition where it is known
(`machine.hooks.check`, called when the node is wired): the node's files know no machine."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from ..errors import ConfigError

DEFAULT_TIMEOUT = 30.0
MAX_TIMEOUT = 3600.0  # an hour: a drain may be slow, but a hook is never left running unbounded
_KEYS = ("before", "after", "timeout_seconds")


class HookConfig(NamedTuple):
    """Commands (argv) by trigger name, run before and after transitions, each bounded."""

    before: Mapping[str, tuple[str, ...]] = MappingProxyType({})  # read-only: a shared default
    after: Mapping[str, tuple[str, ...]] = MappingProxyType({})
    timeout_seconds: float = DEFAULT_TIMEOUT

    def listed(self) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
        """Every hook as (when, trigger, argv): the befores, then the afters, by trigger."""
        return tuple((when, trigger, argv) for when, table in (("before", self.before),
                                                               ("after", self.after))
                     for trigger, argv in sorted(table.items()))


def _bad(source: Path, key: str, value: Any, expected: str) -> ConfigError:
    text = repr(value)
    text = text if len(text) <= 200 else text[:197] + "..."
    return ConfigError(f"config {source}: `{key}` is {text}; expected {expected}")


def absolute_argv(source: Path, key: str, value: Any,
                  example: str = '["/usr/local/sbin/drain-node", "--wait"]') -> tuple[str, ...]:
    """A command root runs from the host's config (a hook, a judgment's check): a non-empty list
    of strings, the first an absolute path (no $PATH search: the config names exactly what root
    runs)."""
    if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value) \
            or not value[0].startswith("/") or any("\0" in a for a in value):
        raise _bad(source, key, value, f"a non-empty list of strings, the first an absolute "
                   f"path, e.g. {example}")
    return tuple(value)


def parse(source: Path, table: Any) -> HookConfig:
    """Check a `[hooks]` table: `before` and `after` (trigger → argv), `timeout_seconds`."""
    if not isinstance(table, dict):
        raise _bad(source, "hooks", table, "a table")
    unknown = sorted(set(table) - set(_KEYS))
    if unknown:
        names = ", ".join(f"`hooks.{k}`" for k in unknown)
        raise ConfigError(f"config {source}: unknown key {names}; known keys here: "
                          f"{', '.join(sorted(_KEYS))}")
    kwargs: dict[str, Any] = {}
    for when in ("before", "after"):
        if when in table:
            hooks = table[when]
            if not isinstance(hooks, dict):
                raise _bad(source, f"hooks.{when}", hooks, "a table of trigger = argv")
            kwargs[when] = {trigger: absolute_argv(source, f"hooks.{when}.{trigger}", argv)
                            for trigger, argv in hooks.items()}
    if "timeout_seconds" in table:
        value = table["timeout_seconds"]
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not math.isfinite(value) or not 0 < value <= MAX_TIMEOUT:
            raise _bad(source, "hooks.timeout_seconds", value,
                       f"a finite number above 0, at most {MAX_TIMEOUT:g}")
        kwargs["timeout_seconds"] = float(value)
    return HookConfig(**kwargs)
