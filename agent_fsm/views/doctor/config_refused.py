"""A config agent-fsm refuses, as `doctor` reports it: the refusal, and the line it is about."""

from __future__ import annotations

import re
from pathlib import Path

from ...errors import ConfigError
from .finding import Finding

_NAMED = re.compile(r"`([A-Za-z0-9_.\[\]-]+)`")


def line_of(text: str, key: str) -> int | None:
    """The line (1-based) where `key` (dotted: `judgment.soak_seconds`) is set in `text`. Its last
    part is a key at the start of a line, under the table its other parts name."""
    parts = [p for p in re.sub(r"\[\d+\]", "", key).split(".") if p]
    if not parts:
        return None
    table, name = ".".join(parts[:-1]), parts[-1]
    here = ""
    for number, line in enumerate(text.splitlines(), 1):
        header = re.match(r"\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$", line)
        if header:
            here = header.group(1).replace('"', "").replace(" ", "")
            continue
        if here == table and re.match(rf'\s*"?{re.escape(name)}"?\s*=', line):
            return number
    return None


def config_refused(source: Path, error: ConfigError) -> Finding:
    """The finding for a config `config.load` refused: its words, and the line of the key it names
    if the file has one."""
    named = _NAMED.search(str(error))
    line = None
    if named is not None:
        try:
            line = line_of(source.read_text(encoding="utf-8"), named.group(1))
        except (OSError, UnicodeDecodeError):
            line = None
    where = f" (line {line})" if line is not None else ""
    return Finding("config", "fail", f"{error}{where}",
                   f"correct {source}{where}; docs/configuration.md lists every key and its "
                   "values (agent-fsm --help lists the keys too)")
