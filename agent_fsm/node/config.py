"""The host's configuration: a TOML file, every key checked, unknown keys refused.

The way back (`recover`, and the daemon on a signal's way back) reads it leniently (unknown keys
logged and ignored) and, when it is wrong all the same, runs with the settings kept with the
last-good when it was promoted (`to_table` writes them, `parse` reads them back; see
`kept.way_back_config`): a `Fallback` in `Config.fallback` says so.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import ConfigError
from ..untrusted import control_character
from .check_config import Check
from .check_config import parse as parse_checks
from .check_config import to_table as checks_table
from .hook_config import HookConfig
from .hook_config import parse as parse_hooks

DEFAULT_CONFIG = Path("/etc/agent-fsm/config.toml")
CONFIG_ENV = "AGENT_FSM_CONFIG"


class Judgment(NamedTuple):
    """How a candidate is judged: from the host's config, never from the candidate's."""

    deadline_seconds: float = 120.0
    soak_seconds: float = 30.0
    max_attempts: int = 3
    checks: tuple[Check, ...] = ()  # argv lists and HTTP checks (`check_config`)
    restart_seconds: float = 1.0  # the agent unit's RestartSec=


class WorkloadConfig(NamedTuple):
    """[workload]: how the daemon runs the selected release's workload on this host (never
    from the release). `user`/`group`: a name or a number (None: root, and the user's primary
    group); `environment` on top of the documented one; `writable_paths` rendered into the agent
    unit (`ReadWritePaths=`); `identifier`: its journal `SYSLOG_IDENTIFIER` (None: `name`)."""

    user: str | int | None = None
    group: str | int | None = None
    environment: tuple[tuple[str, str], ...] = ()
    writable_paths: tuple[Path, ...] = ()
    identifier: str | None = None


class Fallback(NamedTuple):
    """Why and with what the way back runs when the live config is wrong: the live file's
    error, and the last-good's settings used instead (their version and file)."""

    error: str
    version: str
    kept: Path

    def to_json(self) -> dict[str, str]:
        return {"error": self.error, "version": self.version, "kept": str(self.kept)}


class Config(NamedTuple):
    """Where agent-fsm keeps things on the host, and how it judges upgrades."""

    name: str = "agent-fsm"
    state_dir: Path = Path("/var/lib/agent-fsm")
    lib_dir: Path = Path("/usr/local/lib/agent-fsm")
    unit_dir: Path = Path("/etc/systemd/system")
    run_dir: Path = Path("/run/agent-fsm")
    inhibitor_dir: Path = Path("/run/agent-fsm-inhibitors")  # workloads' inhibitor files
    python: Path = Path("/usr/bin/python3")  # the interpreter a release's bin/agent-fsm runs
    allowed_signers: Path | None = None  # ssh-keygen's allowed-signers file; None: unsigned ok
    history_limit: int = 200
    publish_command: tuple[str, ...] = ()
    # After a good judgment, how long publishing may fail before the result is queued in the
    # outbox and the gate opens anyway (`complete_queued`): a dead publisher's bounded way out.
    publish_give_up_seconds: float = 600.0
    systemctl: tuple[str, ...] = ("systemctl",)  # the argv prefix of every systemctl call
    podman: tuple[str, ...] = ("podman",)  # the argv prefix of every podman call (release images)
    # The link on PATH that runs the selected release's bin/agent-fsm; None: no link.
    bin_link: Path | None = Path("/usr/local/bin/agent-fsm")
    judgment: Judgment = Judgment()
    hooks: HookConfig = HookConfig()  # [hooks]: before/after transitions
    workload: WorkloadConfig = WorkloadConfig()  # [workload]: the workload's user, environment...
    source: Path | None = None  # the file it was read from, if any
    fallback: Fallback | None = None  # the way back's: the live file is wrong, these are kept


_TOP_KEYS = {
    "name": str,
    "state_dir": Path,
    "lib_dir": Path,
    "unit_dir": Path,
    "run_dir": Path,
    "inhibitor_dir": Path,
    "python": Path,
    "allowed_signers": Path,
    "history_limit": int,
    "publish_command": list,
    "publish_give_up_seconds": float,
    "systemctl": list,
    "podman": list,
    "bin_link": str,
    "judgment": dict,
    "hooks": dict,
    "workload": dict,
}
# What systemd and the agent can take. A week bounds a judgment (and TimeoutStartSec=, which
# is deadline + soak + 10 whole seconds); StartLimitBurst= is max_attempts.
WEEK = 7 * 86400
BOUNDS: dict[str, tuple[float, float]] = {  # key: (lowest, highest); only soak may be 0
    "history_limit": (1, 100_000),
    "publish_give_up_seconds": (0, WEEK),
    "judgment.deadline_seconds": (0, WEEK),
    "judgment.soak_seconds": (0, WEEK),
    "judgment.max_attempts": (1, 100),
    "judgment.restart_seconds": (0, 3600),
}
# A unit name's prefix (systemd.unit(5) "DESCRIPTION": ASCII letters, digits, ":", "-", "_",
# "." and a backslash), less three: no backslash (systemd's escape character) and no ":" (which
# `systemd-analyze verify` cannot take in a unit file's name); none leading "-" (it would read as
# an option) or "." (a hidden file).
NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
# Directories are written into ReadWritePaths=, RuntimeDirectory= and an ExecStart= executable
# (see `quoting.unit_path`): none of these characters can be expressed there.
_NOT_IN_DIRS = "\"'\\$"
MAX_PATH_BYTES = 1024

_WORKLOAD_KEYS = {
    "user": str,
    "group": str,
    "environment": dict,
    "writable_paths": list,
    "identifier": str,
}
# A user or group name as useradd(8) takes it (and systemd's User=): no ':', no whitespace.
ACCOUNT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What agent-fsm sets itself: the host's table may not take them (the notify variables are the
# daemon's; the release's directories are the release's).
_ENV_RESERVED = frozenset({"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "AGENT_FSM_VERSION",
                           "AGENT_FSM_RELEASE_DIR", "AGENT_FSM_PAYLOAD_DIR"})
IDENTIFIER_RE = re.compile(r"[\x21-\x7e]{1,64}")  # printable ASCII, no space (journalctl -t)

_JUDGMENT_KEYS = {
    "deadline_seconds": float,
    "soak_seconds": float,
    "max_attempts": int,
    "checks": list,
    "restart_seconds": float,
}


def _bad(source: Path, key: str, value: Any, expected: str) -> ConfigError:
    text = repr(value)
    text = text if len(text) <= 200 else text[:197] + "..."
    return ConfigError(f"config {source}: `{key}` is {text}; expected {expected}")


def _check_keys(source: Path, table: dict[str, Any], known: Mapping[str, type], where: str,
                lenient: bool = False, quiet: bool = False) -> None:
    unknown = sorted(set(table) - set(known))
    if unknown:
        names = ", ".join(f"`{where}{k}`" for k in unknown)
        if lenient:  # the way back: a key a newer agent-fsm reads must not strand this one
            if quiet:
                return
            import logging  # here: `status` never logs, and need not import it

            logging.getLogger("agent_fsm").warning(
                "config %s: ignoring unknown key %s (written for a newer agent-fsm?)", source, names)
            return
        allowed = ", ".join(sorted(known))
        raise ConfigError(f"config {source}: unknown key {names}; known keys here: {allowed}")


def _number(source: Path, key: str, value: Any, *, integer: bool) -> Any:
    low, high = BOUNDS[key]
    zero_ok = key == "judgment.soak_seconds"
    kind = "an integer" if integer else "a finite number"
    expected = (f"{kind} from {low:g} to {high:g}" if integer or zero_ok
                else f"{kind} above {low:g}, at most {high:g}")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(source, key, value, expected)
    if integer and not isinstance(value, int):
        raise _bad(source, key, value, expected)
    if isinstance(value, float) and not math.isfinite(value):
        raise _bad(source, key, value, expected)
    if value > high or value < low or (value == low and not integer and not zero_ok):
        raise _bad(source, key, value, expected)
    return value


def _argv(source: Path, key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise _bad(source, key, value, "a list of strings (an argv)")
    return tuple(value)


def _command(source: Path, key: str, value: Any) -> tuple[str, ...]:
    """An argv prefix: a non-empty list of strings, the first an absolute path or a bare name."""
    argv = _argv(source, key, value)
    if not argv or not (argv[0].startswith("/") or (argv[0] and "/" not in argv[0])):
        raise _bad(source, key, value, f'a non-empty list of strings, the first an absolute path '
                   f'or a command name, e.g. ["{key}"]')
    return argv


def _path(source: Path, key: str, value: Any) -> Path:
    """An absolute, normalized directory that every unit and the script can name."""
    if not isinstance(value, str) or not value.startswith("/"):
        raise _bad(source, key, value, "an absolute path")
    control = control_character(value)
    if control is not None:
        raise _bad(source, key, value, f"a path without control characters (it has {control})")
    if any(ch.isspace() or ch in _NOT_IN_DIRS for ch in value):
        raise _bad(source, key, value, "a path without whitespace, quotes, backslashes or '$' "
                   "(systemd cannot take them in ReadWritePaths= or ExecStart=)")
    if value == "/" or value.startswith("//") or os.path.normpath(value) != value:
        raise _bad(source, key, value, "a normalized absolute directory other than / (no '.', "
                   "'..' or empty parts, no trailing '/')")
    if len(value.encode()) > MAX_PATH_BYTES or any(len(p.encode()) > 255 for p in value.split("/")):
        raise _bad(source, key, value, f"a path of at most {MAX_PATH_BYTES} bytes, 255 a part")
    return Path(value)


def _account(source: Path, key: str, value: Any) -> str | int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31 - 1:
        return value
    if isinstance(value, str) and ACCOUNT_RE.fullmatch(value):
        return value
    if isinstance(value, str) and value.isdigit() and int(value) < 2**31 - 1:
        return int(value)
    raise _bad(source, key, value, "a user or group name (letters, digits, '_', '.', '-', not "
               "starting with a digit or '-') or a number from 0")


def _workload(source: Path, table: Any, lenient: bool, quiet: bool) -> WorkloadConfig:
    if not isinstance(table, dict):
        raise _bad(source, "workload", table, "a table")
    _check_keys(source, table, _WORKLOAD_KEYS, "workload.", lenient, quiet)
    w: dict[str, Any] = {}
    for key in ("user", "group"):
        if key in table:
            w[key] = _account(source, f"workload.{key}", table[key])
    if "environment" in table:
        env = table["environment"]
        if not isinstance(env, dict):
            raise _bad(source, "workload.environment", env, "a table of names to strings")
        for name, value in env.items():
            if not ENV_NAME_RE.fullmatch(name) or name in _ENV_RESERVED:
                raise _bad(source, f"workload.environment.{name}", value, "a variable named "
                           "with letters, digits and '_' (not starting with a digit), other than "
                           + ", ".join(sorted(_ENV_RESERVED)))
            if not isinstance(value, str) or "\0" in value:
                raise _bad(source, f"workload.environment.{name}", value,
                           "a string without NUL characters")
        w["environment"] = tuple(env.items())
    if "writable_paths" in table:
        paths = table["writable_paths"]
        if not isinstance(paths, list):
            raise _bad(source, "workload.writable_paths", paths, "a list of absolute paths")
        w["writable_paths"] = tuple(dict.fromkeys(
            _path(source, f"workload.writable_paths[{i}]", p) for i, p in enumerate(paths)))
    if "identifier" in table:
        ident = table["identifier"]
        if not isinstance(ident, str) or not IDENTIFIER_RE.fullmatch(ident):
            raise _bad(source, "workload.identifier", ident,
                       "1 to 64 printable ASCII characters without spaces")
        w["identifier"] = ident
    return WorkloadConfig(**w)


def check_source(source: Path) -> Path:
    """The config file's own path, as the units and the script name it: absolute (relative to
    the working directory it was given in), and without control characters."""
    source = source if source.is_absolute() else source.absolute()
    control = control_character(str(source))
    if control is not None:
        raise ConfigError(f"config file path {str(source)!r} contains a control character "
                          f"({control}); the units and the recovery script must name it")
    return source


def parse(data: dict[str, Any], source: Path, *, lenient: bool = False,
          quiet: bool = False) -> Config:
    """Check a parsed TOML table and build the Config it describes; `lenient`: unknown keys
    are logged and ignored instead of refused (what systemd runs: `daemon`, `recover`), or
    only ignored when `quiet`."""
    _check_keys(source, data, _TOP_KEYS, "", lenient, quiet)
    kwargs: dict[str, Any] = {"source": source}
    if "name" in data:
        name = data["name"]
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise _bad(source, "name", name, "a unit name prefix of 1 to 128 ASCII letters, "
                       "digits, '_', '.' and '-', not starting with '-' or '.'")
        kwargs["name"] = name
    for key in ("state_dir", "lib_dir", "unit_dir", "run_dir", "python"):
        if key in data:
            kwargs[key] = _path(source, key, data[key])
    if "allowed_signers" in data:  # a file, named like the directories (`release add` reads it)
        kwargs["allowed_signers"] = _path(source, "allowed_signers", data["allowed_signers"])
    run_dir = kwargs.get("run_dir")
    if run_dir is not None and (Path("/run") not in run_dir.parents or ":" in str(run_dir)):
        raise _bad(source, "run_dir", str(run_dir), "a directory below /run, without ':' "
                   "(a tmpfs: the gate must close at every boot)")
    if "inhibitor_dir" in data:
        where, gate_dir = _path(source, "inhibitor_dir", data["inhibitor_dir"]), \
            kwargs.get("run_dir", Config().run_dir)
        if Path("/run") not in where.parents or where == gate_dir \
                or gate_dir in where.parents or where in gate_dir.parents:
            raise _bad(source, "inhibitor_dir", str(where), "a directory below /run (a tmpfs: "
                       "inhibitors end at boot), apart from run_dir (removed when the agent stops)")
        kwargs["inhibitor_dir"] = where
    if "history_limit" in data:
        kwargs["history_limit"] = _number(source, "history_limit", data["history_limit"],
                                          integer=True)
    if "publish_command" in data:
        kwargs["publish_command"] = _argv(source, "publish_command", data["publish_command"])
    if "publish_give_up_seconds" in data:
        kwargs["publish_give_up_seconds"] = float(_number(
            source, "publish_give_up_seconds", data["publish_give_up_seconds"], integer=False))
    if "systemctl" in data:
        kwargs["systemctl"] = _command(source, "systemctl", data["systemctl"])
    if "podman" in data:
        kwargs["podman"] = _command(source, "podman", data["podman"])
    if "bin_link" in data:  # a file's path, named like the directories; "" for none
        link = data["bin_link"]
        kwargs["bin_link"] = None if link == "" else _path(source, "bin_link", link)
    if "judgment" in data:
        table = data["judgment"]
        if not isinstance(table, dict):
            raise _bad(source, "judgment", table, "a table")
        _check_keys(source, table, _JUDGMENT_KEYS, "judgment.", lenient, quiet)
        j: dict[str, Any] = {}
        for key in ("deadline_seconds", "soak_seconds", "restart_seconds"):
            if key in table:
                j[key] = float(_number(source, f"judgment.{key}", table[key], integer=False))
        if "max_attempts" in table:
            j["max_attempts"] = _number(source, "judgment.max_attempts", table["max_attempts"],
                                        integer=True)
        if "checks" in table:
            j["checks"] = parse_checks(source, table["checks"])
        kwargs["judgment"] = Judgment(**j)
    if "hooks" in data:
        kwargs["hooks"] = parse_hooks(source, data["hooks"])
    if "workload" in data:
        kwargs["workload"] = _workload(source, data["workload"], lenient, quiet)
    return Config(**kwargs)


def to_table(config: Config) -> dict[str, Any]:
    """Every setting of `config` as the TOML table `parse` reads back into it (its source and
    fallback aside), in JSON's types: what is kept with the last-good when it is promoted."""
    j, hooks = config.judgment, config.hooks
    table: dict[str, Any] = {
        "name": config.name,
        **{key: str(getattr(config, key)) for key in (
            "state_dir", "lib_dir", "unit_dir", "run_dir", "inhibitor_dir", "python")},
        "history_limit": config.history_limit,
        "publish_command": list(config.publish_command),
        "publish_give_up_seconds": config.publish_give_up_seconds,
        "systemctl": list(config.systemctl),
        "podman": list(config.podman),
        "judgment": {"deadline_seconds": j.deadline_seconds, "soak_seconds": j.soak_seconds,
                     "max_attempts": j.max_attempts, "checks": checks_table(j.checks),
                     "restart_seconds": j.restart_seconds},
        "hooks": {"before": {t: list(a) for t, a in hooks.before.items()},
                  "after": {t: list(a) for t, a in hooks.after.items()},
                  "timeout_seconds": hooks.timeout_seconds},
    }
    if config.allowed_signers is not None:
        table["allowed_signers"] = str(config.allowed_signers)
    table["bin_link"] = "" if config.bin_link is None else str(config.bin_link)
    w = config.workload
    table["workload"] = {
        **{k: v for k, v in (("user", w.user), ("group", w.group), ("identifier", w.identifier))
           if v is not None},
        "environment": dict(w.environment),
        "writable_paths": [str(p) for p in w.writable_paths]}
    return table


def source_of(path: Path | None, root: Path | None = None) -> tuple[Path, bool]:
    """The config file `load` reads, and whether it was named explicitly (option or
    environment): the default file (below `root`, if given) otherwise."""
    explicit = path if path is not None else (
        Path(os.environ[CONFIG_ENV]) if os.environ.get(CONFIG_ENV) else None
    )
    default = DEFAULT_CONFIG if root is None else root / DEFAULT_CONFIG.relative_to("/")
    return check_source(explicit or default), explicit is not None


def state_dir_named(source: Path) -> Path | None:
    """The `state_dir` a config file names, if it is TOML and that one key is valid, whatever
    else is wrong with it (where the way back looks for the last-good's kept settings)."""
    try:
        data = tomllib.loads(source.read_text(encoding="utf-8"))
        return _path(source, "state_dir", data["state_dir"])
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, KeyError, ConfigError):
        return None


def load(path: Path | None, root: Path | None = None, *, lenient: bool = False,
         quiet: bool = False) -> Config:
    """Read the config from `path`, $AGENT_FSM_CONFIG, or the default file (below `root`, the
    --root, if given: the host's own config, which its units name).

    A file named explicitly (option or environment) must exist; the default file may be absent,
    and then every default applies.
    """
    source, explicit = source_of(path, root)
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        if not explicit:
            return Config()
        raise ConfigError(
            f"config file {source} does not exist; create it or pass another with --config"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {source} cannot be read: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {source} is not valid TOML: {exc}") from None
    config = parse(data, source, lenient=lenient, quiet=quiet)
    _launcher_reads(source, text, data.get("python"))
    return config


# How a release's bin/agent-fsm reads `python` before any Python runs (`vendoring._READ_PYTHON`
# is the same rule in sed): lines split at LF only; the reading stops at the first table header
# or line holding `{`, `"""` or `'''` (before it, no value spans lines but an array, which holds
# no key, and every key is the root table's), or at the first line that begins `python =`,
# whose value it takes when it is a basic string without escapes or control characters.
_SPACE = " \t\n\v\f\r"  # sed's [[:space:]]
_PYTHON_START = re.compile(f"[{_SPACE}]*python[{_SPACE}]*=")
_PYTHON_LINE = re.compile(f'[{_SPACE}]*python[{_SPACE}]*=[{_SPACE}]*"([^"\\\\\x00-\x1f\x7f]*)"'
                          f"[{_SPACE}]*(#.*)?", re.S)
_TABLE = re.compile(f"[{_SPACE}]*\\[")
_STOPS = ("{", '"""', "'''")


def launcher_python(text: str) -> str | None:
    """The `python` a release's bin/agent-fsm reads from config text; None: it reads none."""
    for line in text.split("\n"):
        if _TABLE.match(line) or any(stop in line for stop in _STOPS):
            return None
        if _PYTHON_START.match(line):
            found = _PYTHON_LINE.fullmatch(line)
            return None if found is None else found.group(1)
    return None


def _launcher_reads(source: Path, text: str, value: Any) -> None:
    """Refuse a file whose `python` the launcher would read otherwise than TOML does."""
    if launcher_python(text) == value:
        return
    if value is None:
        raise ConfigError(
            f"config {source}: a line reads as `python` to a release's bin/agent-fsm, which "
            "finds it before Python starts, but TOML reads no `python` there; move that text "
            "below the first table")
    raise ConfigError(
        f'config {source}: write `python` as one line `python = "{value}"` before any table, '
        "inline table or multi-line string: a release's bin/agent-fsm reads it there "
        "before Python starts")
