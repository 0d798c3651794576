"""How a host value is written into a systemd unit, and how into a POSIX shell script.

Each function returns the value's text, or raises ValueError when it cannot be expressed there.
A value needing no quoting comes back unchanged.

Units (systemd 252; sections of the man pages):

- `unit_word`: one `ExecStart=` argument, double-quoted with C escapes (systemd.syntax(7)
  "QUOTING"). `%` and `$` are doubled, as specifiers and variables expand after unquoting.
  Whitespace, quotes, backslashes and `;` are quoted.
- `unit_path`: a path-valued setting, or an `ExecStart=` executable. It is split on whitespace
  and a quote counts only at an item's start, so whitespace, quotes and backslashes cannot be
  expressed; nor `$` (systemd.service(5)). `%` is doubled.
- `unit_token`: names and numbers: only `[A-Za-z0-9:_.+-]`.

Scripts: `shell_word` is `shlex.quote`. No control character is allowed: a newline would end a
unit line or a script comment.
"""

from __future__ import annotations

import re
import shlex

from ..untrusted import control_character

_TOKEN = re.compile(r"[A-Za-z0-9:_.+-]+")
_WORD_NEEDS_QUOTES = frozenset(" \t\n\r\"'\\;")
_NOT_IN_UNIT_PATH = frozenset("\"'\\$")


def _no_control(value: str) -> None:
    found = control_character(value)
    if found is not None:
        raise ValueError(f"{value!r} contains a control character ({found})")


def unit_token(value: str) -> str:
    """A name or a number in a unit: letters, digits and `:_.+-` only, written as it is."""
    if not _TOKEN.fullmatch(value):
        raise ValueError(f"{value!r} is not a plain token (letters, digits, ':_.+-')")
    return value


def unit_word(value: str) -> str:
    """One command-line argument of `ExecStart=`: quoted if needed, `%` and `$` doubled."""
    _no_control(value)
    text = value.replace("%", "%%").replace("$", "$$")
    if value and not _WORD_NEEDS_QUOTES.intersection(value):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def unit_path(value: str) -> str:
    """A path in a path-valued setting or an executable's path, with `%` doubled.

    Refused if it has whitespace, quotes, backslashes or `$`, which systemd cannot take there.
    """
    _no_control(value)
    bad = sorted({ch for ch in value if ch.isspace() or ch in _NOT_IN_UNIT_PATH})
    if bad or not value:
        raise ValueError(f"{value!r} cannot be a path in a unit (it has {' '.join(map(repr, bad))})"
                         if bad else "an empty path cannot be written into a unit")
    return value.replace("%", "%%")


def shell_word(value: str) -> str:
    """One word of a POSIX shell script: `shlex.quote`d (unchanged when nothing needs it)."""
    _no_control(value)
    return shlex.quote(value)
