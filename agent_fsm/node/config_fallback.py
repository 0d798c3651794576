"""The config the way back runs with. It is the live file, read leniently (unknown keys logged and
ignored). When that is wrong all the same (a value out of range, not TOML), it is the settings kept
with the last-good at its promotion (`assets.kept`), and `Config.fallback` says why. `recover` and
the last-good's daemon on a signal's way back run with them and say so in their log and in `status`.
Operator commands keep refusing the live file."""

from __future__ import annotations

from pathlib import Path

from ..errors import AssetError, ConfigError
from . import config as config_mod
from .assets.kept import read as read_kept
from .config import Config, Fallback
from .paths import Paths

_PACKAGE = Path(__file__).resolve().parents[1]  # this agent_fsm: in a stored release, its lib/


def _own_state_dir() -> Path | None:
    """The state dir this agent-fsm runs from, when it runs from a stored release
    (`<state_dir>/releases/<version>/lib/agent_fsm`, as the units and the script start it)."""
    lib = _PACKAGE.parent
    if lib.name == "lib" and lib.parent.parent.name == "releases":
        return lib.parent.parent.parent
    return None


def _warn(quiet: bool, message: str) -> None:
    if not quiet:  # imported here: `status` (quiet) never logs, and need not import it
        import logging

        logging.getLogger("agent_fsm").warning("%s", message)


def tell_fallback(config: Config) -> None:
    """Log, once the way back goes on with them, that the kept settings replace the live file."""
    f = config.fallback
    if f is not None:
        _warn(False, f"{f.error}; the way back goes on with last-good {f.version}'s settings, "
              f"kept in {f.kept} when it was promoted; fix the file (operator commands refuse "
              "it meanwhile)")


def way_back_config(path: Path | None, root: Path | None = None, *,
                    quiet: bool = False) -> Config:
    """The config the way back runs with: the live file, read leniently. When it is wrong all the
    same, the settings kept with the last-good, `fallback` saying why (`tell_fallback` logs it where
    the caller goes on with them). They are looked for in the state dir this agent-fsm runs from,
    the one the broken file still names, and the default. The first copy kept for its own dir is
    used. ConfigError, the live file's, when none is. `quiet`: log nothing (`status`)."""
    try:
        return config_mod.load(path, root, lenient=True, quiet=quiet)
    except ConfigError as exc:
        live = exc
    source, _ = config_mod.source_of(path, root)
    dirs: list[Path] = []
    named = config_mod.state_dir_named(source)
    for found in (_own_state_dir(), None if named is None else Paths(Config(state_dir=named),
                  root).state_dir, Paths(Config(), root).state_dir):
        if found is not None and found not in dirs:
            dirs.append(found)
    for state_dir in dirs:
        where = state_dir / "last-good-assets.json"
        try:
            kept = read_kept(where)
        except AssetError as exc:
            _warn(quiet, str(exc))
            continue
        if kept is None or kept.settings is None:
            continue
        try:
            settings = config_mod.parse(kept.settings, where, lenient=True, quiet=quiet)
        except ConfigError as exc:
            _warn(quiet, f"the last-good's kept settings are not usable: {exc}")
            continue
        settings = settings._replace(source=source)  # the file the units name, as before
        if Paths(settings, root).state_dir != state_dir:
            continue  # kept for another state dir: not this node's
        return settings._replace(fallback=Fallback(str(live), kept.version, where))
    looked = ", ".join(str(d / "last-good-assets.json") for d in dirs)
    raise ConfigError(f"{live} (and no settings of the last-good are kept in {looked} for the "
                      "way back to use instead)") from None
