"""How each kind of config value is checked. A check takes the file, the key as the file names
it and the value TOML gave, and returns the value as the config holds it, or raises a
ConfigError naming the file, the key, the value and what was expected."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..untrusted import control_character

# One kind of value: (source, key, value) -> the value the config holds.
Check = Callable[[Path, str, Any], Any]

# A unit name's prefix (systemd.unit(5) "DESCRIPTION": ASCII letters, digits, ":", "-", "_",
# "." and a backslash), less three: no backslash (systemd's escape character) and no ":" (which
# `systemd-analyze verify` cannot take in a unit file's name); none leading "-" (it would read as
# an option) or "." (a hidden file).
NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
# Directories are written into ReadWritePaths=, RuntimeDirectory= and an ExecStart= executable
# (see `quoting.unit_path`): none of these characters can be expressed there.
_NOT_IN_DIRS = "\"'\\$"
MAX_PATH_BYTES = 1024
# A user or group name as useradd(8) takes it (and systemd's User=): no ':', no whitespace.
ACCOUNT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What agent-fsm sets itself: the host's table may not take them (the notify variables are the
# daemon's; the release's directories are the release's).
_ENV_RESERVED = frozenset({"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "AGENT_FSM_VERSION",
                           "AGENT_FSM_RELEASE_DIR", "AGENT_FSM_PAYLOAD_DIR"})
IDENTIFIER_RE = re.compile(r"[\x21-\x7e]{1,64}")  # printable ASCII, no space (journalctl -t)


def bad(source: Path, key: str, value: Any, expected: str) -> ConfigError:
    text = repr(value)
    text = text if len(text) <= 200 else text[:197] + "..."
    return ConfigError(f"config {source}: `{key}` is {text}; expected {expected}")


def number(low: float, high: float, *, integer: bool = False, zero_ok: bool = False) -> Check:
    """A number from `low` to `high`: an integer, or a finite number above `low` (from it,
    when `zero_ok`), held as a float."""
    kind = "an integer" if integer else "a finite number"
    expected = (f"{kind} from {low:g} to {high:g}" if integer or zero_ok
                else f"{kind} above {low:g}, at most {high:g}")

    def check(source: Path, key: str, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or (integer and not isinstance(value, int)) \
                or (isinstance(value, float) and not math.isfinite(value)) \
                or value > high or value < low or (value == low and not integer and not zero_ok):
            raise bad(source, key, value, expected)
        return value if integer else float(value)

    return check


def name(source: Path, key: str, value: Any) -> str:
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise bad(source, key, value, "a unit name prefix of 1 to 128 ASCII letters, digits, "
                  "'_', '.' and '-', not starting with '-' or '.'")
    return value


def argv(source: Path, key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise bad(source, key, value, "a list of strings (an argv)")
    return tuple(value)


def command(source: Path, key: str, value: Any) -> tuple[str, ...]:
    """An argv prefix: a non-empty list of strings, the first an absolute path or a bare name."""
    found = argv(source, key, value)
    if not found or not (found[0].startswith("/") or (found[0] and "/" not in found[0])):
        raise bad(source, key, value, f'a non-empty list of strings, the first an absolute path '
                  f'or a command name, e.g. ["{key}"]')
    return found


def path(source: Path, key: str, value: Any) -> Path:
    """An absolute, normalized directory that every unit and the script can name."""
    if not isinstance(value, str) or not value.startswith("/"):
        raise bad(source, key, value, "an absolute path")
    control = control_character(value)
    if control is not None:
        raise bad(source, key, value, f"a path without control characters (it has {control})")
    if any(ch.isspace() or ch in _NOT_IN_DIRS for ch in value):
        raise bad(source, key, value, "a path without whitespace, quotes, backslashes or '$' "
                  "(systemd cannot take them in ReadWritePaths= or ExecStart=)")
    if value == "/" or value.startswith("//") or os.path.normpath(value) != value:
        raise bad(source, key, value, "a normalized absolute directory other than / (no '.', "
                  "'..' or empty parts, no trailing '/')")
    if len(value.encode()) > MAX_PATH_BYTES or any(len(p.encode()) > 255 for p in value.split("/")):
        raise bad(source, key, value, f"a path of at most {MAX_PATH_BYTES} bytes, 255 a part")
    return Path(value)


def run_dir(source: Path, key: str, value: Any) -> Path:
    """A directory below /run, without ':' (a tmpfs: the gate must close at every boot)."""
    where = path(source, key, value)
    if Path("/run") not in where.parents or ":" in str(where):
        raise bad(source, key, str(where), "a directory below /run, without ':' "
                  "(a tmpfs: the gate must close at every boot)")
    return where


def apart(source: Path, key: str, where: Path, gate_dir: Path) -> None:
    """An inhibitor directory lies below /run, apart from the gate's (`run_dir`)."""
    if Path("/run") not in where.parents or where == gate_dir \
            or gate_dir in where.parents or where in gate_dir.parents:
        raise bad(source, key, str(where), "a directory below /run (a tmpfs: inhibitors end at "
                  "boot), apart from run_dir (removed when the agent stops)")


def link(source: Path, key: str, value: Any) -> Path | None:
    """A file's path, named like the directories; "" for none."""
    return None if value == "" else path(source, key, value)


def account(source: Path, key: str, value: Any) -> str | int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31 - 1:
        return value
    if isinstance(value, str) and ACCOUNT_RE.fullmatch(value):
        return value
    if isinstance(value, str) and value.isdigit() and int(value) < 2**31 - 1:
        return int(value)
    raise bad(source, key, value, "a user or group name (letters, digits, '_', '.', '-', not "
              "starting with a digit or '-') or a number from 0")


def environment(source: Path, key: str, value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict):
        raise bad(source, key, value, "a table of names to strings")
    for var, text in value.items():
        if not ENV_NAME_RE.fullmatch(var) or var in _ENV_RESERVED:
            raise bad(source, f"{key}.{var}", text, "a variable named with letters, digits and "
                      "'_' (not starting with a digit), other than "
                      + ", ".join(sorted(_ENV_RESERVED)))
        if not isinstance(text, str) or "\0" in text:
            raise bad(source, f"{key}.{var}", text, "a string without NUL characters")
    return tuple(value.items())


def paths(source: Path, key: str, value: Any) -> tuple[Path, ...]:
    """A list of absolute paths, each once."""
    if not isinstance(value, list):
        raise bad(source, key, value, "a list of absolute paths")
    return tuple(dict.fromkeys(path(source, f"{key}[{i}]", p) for i, p in enumerate(value)))


def identifier(source: Path, key: str, value: Any) -> str:
    if not isinstance(value, str) or not IDENTIFIER_RE.fullmatch(value):
        raise bad(source, key, value, "1 to 64 printable ASCII characters without spaces")
    return value
