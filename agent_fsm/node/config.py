"""The host's configuration: a TOML file, every key checked, unknown keys refused.

Each key is declared once, in `SETTINGS`: how it is checked and kept (`to_table`), the commands it
has root run (`doctor`), and its name in `--help` and docs/configuration.md. A test holds the docs
to the table. The records below hold the values and defaults.

The way back (`recover`, the daemon on a signal's way back) reads it leniently: unknown keys are
logged and ignored. When it is wrong all the same, the way back runs with the settings kept when the
last-good was promoted (`to_table` writes them, `parse` reads them back). `Config.fallback` says so.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import ConfigError
from ..untrusted import control_character
from . import config_values as values
from .channel_config import KEYS as CHANNEL_KEYS
from .channel_config import ChannelConfig
from .check_config import Check, HttpCheck
from .check_config import parse as parse_checks
from .check_config import to_table as checks_table
from .hook_config import MAX_TIMEOUT as MAX_HOOK_TIMEOUT
from .hook_config import HookConfig, by_trigger
from .store_config import CEILING, StoreConfig

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
    """[workload]: how the daemon runs the selected release's workload on this host, never from the
    release. `user`/`group`: a name or number (None: root, and the user's primary group);
    `environment`: added to the documented one; `writable_paths`: the unit's `ReadWritePaths=`;
    `identifier`: its journal `SYSLOG_IDENTIFIER` (None: `name`)."""

    user: str | int | None = None
    group: str | int | None = None
    environment: tuple[tuple[str, str], ...] = ()
    writable_paths: tuple[Path, ...] = ()
    identifier: str | None = None


class Fallback(NamedTuple):
    """Why and with what the way back runs when the live config is wrong: the live file's error, and
    the last-good's settings used instead (their version and file)."""

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
    # How long publishing may fail after a good judgment before the result is queued in the outbox
    # and the gate opens anyway (`complete_queued`): a dead publisher's bounded way out.
    publish_give_up_seconds: float = 600.0
    systemctl: tuple[str, ...] = ("systemctl",)  # the argv prefix of every systemctl call
    podman: tuple[str, ...] = ("podman",)  # the argv prefix of every podman call (release images)
    # The link on PATH that runs the selected release's bin/agent-fsm; None: no link.
    bin_link: Path | None = Path("/usr/local/bin/agent-fsm")
    judgment: Judgment = Judgment()
    hooks: HookConfig = HookConfig()  # [hooks]: before/after transitions
    workload: WorkloadConfig = WorkloadConfig()  # [workload]: the workload's user, environment...
    store: StoreConfig = StoreConfig()  # [store]: how big a release may be
    channel: ChannelConfig = ChannelConfig()  # [channel]: the signed channel it follows
    source: Path | None = None  # the file it was read from, if any
    fallback: Fallback | None = None  # the way back's: the live file is wrong, these are kept


# What systemd and the agent can take. A week bounds a judgment and TimeoutStartSec= (deadline +
# soak + 10, whole seconds); StartLimitBurst= is max_attempts.
WEEK = 7 * 86400


def _same(value: Any) -> Any:
    return value


def _text(value: Path | None) -> str | None:
    return None if value is None else str(value)


def _strings(values_: tuple[Any, ...]) -> list[str]:
    return [str(v) for v in values_]


def _argvs(table: Mapping[str, tuple[str, ...]]) -> dict[str, list[str]]:
    return {name: list(argv) for name, argv in table.items()}


def _one(argv: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    return (argv,)


def _commands(checks: tuple[Check, ...]) -> tuple[tuple[str, ...], ...]:
    return tuple(c for c in checks if not isinstance(c, HttpCheck))


def _hooks(table: Mapping[str, tuple[str, ...]]) -> tuple[tuple[str, ...], ...]:
    return tuple(table.values())


Argvs = Callable[[Any], tuple[tuple[str, ...], ...]]


class Setting(NamedTuple):
    """One key of the file (`section.field` in a table); its default is the record's.

    `check` reads its value. `dump` writes it back in JSON's types (None: not written). `runs`: the
    argvs it has root run. `each`: what names a table's entries. `against`: a check against the keys
    read before it. `own`: one of agent-fsm's directories.
    """

    key: str
    check: values.Check
    dump: Callable[[Any], Any] = _same
    runs: Argvs | None = None
    each: str | None = None
    against: Callable[[Path, Any, Mapping[str, Any]], None] | None = None
    own: bool = False

    @property
    def section(self) -> str | None:
        return self.key.rpartition(".")[0] or None

    @property
    def field(self) -> str:
        return self.key.rpartition(".")[2]

    @property
    def shown(self) -> str:
        """Its name in docs/configuration.md: `name`, `[judgment] checks`, `[hooks.after] TRIGGER`."""
        if self.section is None:
            return self.key
        return f"[{self.key}] {self.each}" if self.each else f"[{self.section}] {self.field}"


def _checks(source: Path, key: str, value: Any) -> tuple[Check, ...]:
    return parse_checks(source, value)


def _apart(source: Path, where: Path, read: Mapping[str, Any]) -> None:
    values.apart(source, "inhibitor_dir", where, read.get("run_dir", Config().run_dir))


# Every key, in the order `parse` checks them; the records hold their values and defaults.
SETTINGS: tuple[Setting, ...] = (
    Setting("name", values.name),
    *(Setting(key, values.path, str, own=True) for key in ("state_dir", "lib_dir", "unit_dir")),
    Setting("run_dir", values.run_dir, str, own=True),
    Setting("python", values.path, str),
    Setting("allowed_signers", values.path, _text),  # a file, named like the directories
    Setting("inhibitor_dir", values.path, str, against=_apart),
    Setting("history_limit", values.number(1, 100_000, integer=True)),
    Setting("publish_command", values.argv, list, runs=_one),
    Setting("publish_give_up_seconds", values.number(0, WEEK)),
    Setting("systemctl", values.command, list, runs=_one),
    Setting("podman", values.command, list, runs=_one),
    Setting("bin_link", values.link, lambda link: "" if link is None else str(link)),
    Setting("judgment.deadline_seconds", values.number(0, WEEK)),
    Setting("judgment.soak_seconds", values.number(0, WEEK, zero_ok=True)),
    Setting("judgment.restart_seconds", values.number(0, 3600)),
    Setting("judgment.max_attempts", values.number(1, 100, integer=True)),
    Setting("judgment.checks", _checks, checks_table, runs=_commands),
    Setting("hooks.before", by_trigger, _argvs, runs=_hooks, each="TRIGGER"),
    Setting("hooks.after", by_trigger, _argvs, runs=_hooks, each="TRIGGER"),
    Setting("hooks.timeout_seconds", values.number(0, MAX_HOOK_TIMEOUT)),
    Setting("workload.user", values.account),
    Setting("workload.group", values.account),
    Setting("workload.environment", values.environment, dict),
    Setting("workload.writable_paths", values.paths, _strings),
    Setting("workload.identifier", values.identifier),
    *(Setting(f"store.{key}", values.number(1, CEILING, integer=True))
      for key in StoreConfig._fields),
    *(Setting(f"channel.{key}", check, dump) for key, check, dump in CHANNEL_KEYS),
)
# Each table's record, and whether its unknown keys are refused even when read leniently.
_SECTIONS: dict[str, tuple[type[Any], bool]] = {
    "judgment": (Judgment, False), "hooks": (HookConfig, True), "workload": (WorkloadConfig, False),
    "store": (StoreConfig, False), "channel": (ChannelConfig, False)}


def _keys(section: str | None) -> frozenset[str]:
    """The keys a table may hold: its settings' (and, at the top, the tables')."""
    keys = {s.field for s in SETTINGS if s.section == section}
    return frozenset(keys | set(_SECTIONS) if section is None else keys)


def _check_keys(source: Path, table: dict[str, Any], known: frozenset[str], where: str,
                lenient: bool = False, quiet: bool = False) -> None:
    unknown = sorted(set(table) - known)
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


def parse(data: dict[str, Any], source: Path, *, lenient: bool = False,
          quiet: bool = False) -> Config:
    """Check a parsed TOML table and build its Config. `lenient`: unknown keys are logged (only
    ignored when `quiet`), not refused: what systemd runs (`daemon`, `recover`) reads so."""
    _check_keys(source, data, _keys(None), "", lenient, quiet)
    top: dict[str, Any] = {"source": source}
    tables: dict[str, dict[str, Any]] = {}
    for setting in SETTINGS:
        section, table, into = setting.section, data, top
        if section is not None:
            if section not in data:
                continue
            table = data[section]
            if section not in tables:
                if not isinstance(table, dict):
                    raise values.bad(source, section, table, "a table")
                strict = _SECTIONS[section][1]
                _check_keys(source, table, _keys(section), f"{section}.",
                            lenient and not strict, quiet)
                tables[section] = {}
            into = tables[section]
        if setting.field in table:
            value = setting.check(source, setting.key, table[setting.field])
            if setting.against is not None:
                setting.against(source, value, into)
            into[setting.field] = value
    for section, fields in tables.items():
        top[section] = _SECTIONS[section][0](**fields)
    return Config(**top)


def check_source(source: Path) -> Path:
    """The config file's own path as the units and the script name it: absolute (relative to the
    working directory it was given in), without control characters."""
    source = source if source.is_absolute() else source.absolute()
    control = control_character(str(source))
    if control is not None:
        raise ConfigError(f"config file path {str(source)!r} contains a control character "
                          f"({control}); the units and the recovery script must name it")
    return source


def _value(config: Config, setting: Setting) -> Any:
    section = setting.section
    return getattr(config if section is None else getattr(config, section), setting.field)


def to_table(config: Config) -> dict[str, Any]:
    """Every setting of `config`, source and fallback aside, as the TOML table `parse` reads back,
    in JSON's types: what is kept with the last-good when it is promoted."""
    table: dict[str, Any] = {section: {} for section in _SECTIONS}
    for setting in SETTINGS:
        value = setting.dump(_value(config, setting))
        if value is not None:
            section = setting.section
            (table if section is None else table[section])[setting.field] = value
    return table


def commands(config: Config) -> tuple[tuple[str, ...], ...]:
    """Every command (argv) the config has root run: checks, hooks, the argv prefixes."""
    return tuple(argv for s in SETTINGS if s.runs is not None for argv in s.runs(_value(config, s)))


def own_directories(config: Config) -> tuple[tuple[str, Path], ...]:
    """agent-fsm's directories (the state dir, the recovery script's, the units', the gate's),
    each with its key: a workload sees them read-only, and `metrics --output` refuses them."""
    return tuple((s.key, _value(config, s)) for s in SETTINGS if s.own)


def keys_text() -> str:
    """The keys of the file, table by table, in one paragraph (`--help`)."""
    parts = [", ".join(s.key for s in SETTINGS if s.section is None)]
    for section in _SECTIONS:
        parts.append(f"[{section}] " + ", ".join(s.field for s in SETTINGS
                                                   if s.section == section))
    return "; ".join(parts)


def source_of(path: Path | None, root: Path | None = None) -> tuple[Path, bool]:
    """The config file `load` reads, and whether it was named (option or environment); otherwise the
    default file, below `root` if given."""
    explicit = path if path is not None else (
        Path(os.environ[CONFIG_ENV]) if os.environ.get(CONFIG_ENV) else None
    )
    default = DEFAULT_CONFIG if root is None else root / DEFAULT_CONFIG.relative_to("/")
    return check_source(explicit or default), explicit is not None


def state_dir_named(source: Path) -> Path | None:
    """The `state_dir` a config file names, if it is TOML and that key is valid, whatever else is
    wrong: where the way back looks for the last-good's kept settings."""
    try:
        data = tomllib.loads(source.read_text(encoding="utf-8"))
        return values.path(source, "state_dir", data["state_dir"])
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, KeyError, ConfigError):
        return None


def load(path: Path | None, root: Path | None = None, *, lenient: bool = False,
         quiet: bool = False) -> Config:
    """Read the config from `path`, $AGENT_FSM_CONFIG, or the default file (below --root `root`, if
    given: the host's config, which its units name).

    A named file (option or environment) must exist; the default file may be absent, and then every
    default applies.
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


# How a release's bin/agent-fsm reads `python` before any Python runs (`vendoring._READ_PYTHON` is
# the same rule in sed). Lines split at LF only. Reading stops at the first table header or line
# holding `{`, `"""` or `'''` (before it no value spans lines but an array, which holds no key, and
# every key is the root table's), or at the first line beginning `python =`, whose value it takes
# when that is a basic string without escapes or control characters.
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
