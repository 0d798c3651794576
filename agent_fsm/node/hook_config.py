"""The host's `[hooks]` table: which command runs before or after which transition, and how long
each may take. The trigger names are checked against the definition where it is known
(`machine.hooks.check`, when the node is wired), since the node's files know no machine."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from .config_values import bad

DEFAULT_TIMEOUT = 30.0
MAX_TIMEOUT = 3600.0  # an hour: a drain may be slow, but a hook is never left running unbounded


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


def absolute_argv(source: Path, key: str, value: Any,
                  example: str = '["/usr/local/sbin/drain-node", "--wait"]') -> tuple[str, ...]:
    """A command root runs from the host's config (a hook, a judgment's check): a non-empty list of
    strings, the first an absolute path. No $PATH search: the config names exactly what root runs."""
    if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value) \
            or not value[0].startswith("/") or any("\0" in a for a in value):
        raise bad(source, key, value, f"a non-empty list of strings, the first an absolute "
                  f"path, e.g. {example}")
    return tuple(value)


def by_trigger(source: Path, key: str, value: Any) -> dict[str, tuple[str, ...]]:
    """`[hooks.before]` or `[hooks.after]`: a table of trigger = argv."""
    if not isinstance(value, dict):
        raise bad(source, key, value, "a table of trigger = argv")
    return {trigger: absolute_argv(source, f"{key}.{trigger}", argv)
            for trigger, argv in value.items()}
