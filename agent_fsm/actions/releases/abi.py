"""What a release needs of the node's interpreter: written to `python.toml` at `release pack`,
checked against the config's `python` at `release add`.

Vendored compiled extensions (pydantic_core's) load only in an interpreter of their ABI.
`python.toml` holds the oldest Python the release runs on and, with compiled extensions, the
packing interpreter's ABI and their suffixes:

    requires_python = "3.11"
    cache_tag = "cpython-311"
    platform = "linux-x86_64"
    extension_suffixes = [".cpython-311-x86_64-linux-gnu.so"]
    extensions = ["pydantic_core/_pydantic_core.cpython-311-x86_64-linux-gnu.so"]

`release add` refuses (exit 3) a release the config's `python` is too old for, cannot load, or
is of another platform. A release without `python.toml` is not checked.

The *targets* (`Needs.targets`) follow from those keys: `("any",)` for pure Python, else the
packing target (`cp311-x86_64`). They are no key of their own, since older agent-fsms refuse
unknown keys. `release pack` fails when the fleet's targets (`FLEET`, `--target`) are not
covered.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ... import files
from ...errors import ConfigError, CouldNotRun, InterpreterUnreadable, Refused, ReleaseError
from ...system import interpreter

FILE = "python.toml"
REQUIRES_PYTHON = (3, 11)  # as the launcher's own check (`vendoring._BOOT`)
MAX_BYTES = 64 << 10
MAX_LISTED = 3  # extensions named in a refusal
_KEYS = {"requires_python", "cache_tag", "platform", "extension_suffixes", "extensions",
         "targets"}
ANY = "any"
# The fleet a release is packed for unless told otherwise: CPython 3.11 to 3.14 on glibc Linux
# (docs/operations.md, the support matrix).
FLEET = tuple(f"cp3{minor}-{machine}" for minor in (11, 12, 13, 14)
              for machine in ("x86_64", "aarch64"))
_TARGET = re.compile(r"cp3[0-9]{1,2}-[a-z0-9_]+")
_AFTER = "nothing was stored"


@dataclass(frozen=True)
class Needs:
    requires_python: tuple[int, ...] = REQUIRES_PYTHON
    cache_tag: str = ""  # the packing interpreter's; "" without compiled extensions
    platform: str = ""
    extension_suffixes: tuple[str, ...] = ()
    extensions: tuple[str, ...] = ()  # relative to lib/

    def describe(self) -> str:
        return f"{self.cache_tag} on {self.platform}"

    @property
    def targets(self) -> tuple[str, ...]:
        """What the release covers: ("any",) without compiled code, else its packing interpreter's target."""
        if not self.extensions:
            return (ANY,)
        return (tag(self.cache_tag, self.platform),)


def tag(cache_tag: str, platform: str) -> str:
    """An interpreter's target: `cp313-aarch64` for cpython-313 on linux-aarch64."""
    return f"cp{cache_tag.removeprefix('cpython-')}-{platform.rpartition('-')[2]}"


def serves(targets: tuple[str, ...], target: str) -> bool:
    """Whether a release covering `targets` runs on `target`, as the launcher decides (`vendoring._BOOT`)."""
    return ANY in targets or target in targets


def covers(targets: tuple[str, ...], requires: tuple[int, ...] = REQUIRES_PYTHON) -> str:
    """`targets` for a person, as `release pack` and `release list` show them."""
    if ANY in targets:
        return f"CPython {'.'.join(map(str, requires))}+ on any platform (pure Python)"
    return ", ".join(targets) + " only"


def parse_targets(asked: tuple[str, ...]) -> tuple[str, ...]:
    """The targets `release pack --target` names (`cp313-aarch64`); ReleaseError otherwise."""
    for target in asked:
        if target != ANY and not _TARGET.fullmatch(target):
            raise ReleaseError(f"cannot pack: {target!r} is not a target; name one as "
                               f"cp<major><minor>-<machine>, e.g. {FLEET[0]} or {FLEET[-1]}")
    return tuple(dict.fromkeys(asked))


def needs(lib: Path) -> Needs:
    """What the packed `lib/` needs: the packing interpreter's ABI, if it holds compiled extensions."""
    here = interpreter.running()
    found: dict[str, str] = {}
    for path in sorted(lib.rglob("*")):
        # A module's name holds no dot: its suffix starts at the name's first one.
        suffix = "." + path.name.split(".", 1)[-1]
        if suffix in here.suffixes and path.is_file():
            found[path.relative_to(lib).as_posix()] = suffix
    if not found:
        return Needs()
    return Needs(REQUIRES_PYTHON, here.cache_tag, here.platform,
                 tuple(sorted(set(found.values()))), tuple(found))


def uncovered(need: Needs, asked: tuple[str, ...]) -> None:
    """ReleaseError (one line) when a release that needs `need` does not cover every target `asked`."""
    missing = [t for t in asked if not serves(need.targets, t)]
    if not missing:
        return
    listed = ", ".join(need.extensions[:MAX_LISTED]) + (
        f" and {len(need.extensions) - MAX_LISTED} more"
        if len(need.extensions) > MAX_LISTED else "")
    raise ReleaseError(
        f"cannot pack a release for {', '.join(missing)}: the environment that packs vendors "
        f"compiled extensions ({listed}) built for {need.targets[0]} only (pydantic_core comes "
        "with typer 0.29 or later); install agent-fsm's own dependencies (pip install "
        f"'typer<0.29'), or pack for this interpreter alone with --target {need.targets[0]}")


def record(release: Path, asked: tuple[str, ...] = ()) -> Needs:
    """Write a packed release's `python.toml` from its `lib/`; ReleaseError if it misses a target `asked`."""
    need = needs(release / "lib")
    uncovered(need, asked)
    # No `targets` key: they follow from the keys below, and an agent-fsm older than them
    # refuses a python.toml with a key it does not know (it may be the one adding this release).
    lines = [f'requires_python = "{".".join(map(str, need.requires_python))}"']
    if need.extensions:
        lines += [f"cache_tag = {json.dumps(need.cache_tag)}",
                  f"platform = {json.dumps(need.platform)}",
                  f"extension_suffixes = {json.dumps(list(need.extension_suffixes))}",
                  f"extensions = {json.dumps(list(need.extensions))}"]
    (release / FILE).write_text(
        "# What this release needs of the node's `python`: written by `agent-fsm release pack`,\n"
        "# checked by `agent-fsm release add` (docs/operations.md, Releases).\n"
        + "\n".join(lines) + "\n")
    return need


def read(release: Path) -> Needs | None:
    """A release's `python.toml`, or None when it has none. ReleaseError when it is invalid."""
    path = release / FILE
    try:
        data = tomllib.loads(files.read_regular(path, MAX_BYTES).decode("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ReleaseError(f"{path} is invalid: {exc}; " + _AFTER) from None
    unknown = sorted(set(data) - _KEYS)
    strings = ("extension_suffixes", "extensions", "targets")
    if unknown or not all(isinstance(data.get(k, ""), str) for k in _KEYS - set(strings)) \
            or not all(isinstance(data.get(k, []), list)
                       and all(isinstance(s, str) for s in data.get(k, [])) for k in strings):
        raise ReleaseError(f"{path} is invalid: " + (
            f"unknown key(s) {', '.join(unknown)} (packed by a newer agent-fsm?)" if unknown
            else "a value of the wrong type") + "; " + _AFTER)
    try:
        requires = tuple(int(p) for p in data.get("requires_python", "3.11").split("."))
    except ValueError:
        raise ReleaseError(f"{path} is invalid: requires_python is "
                           f"{data['requires_python']!r}; " + _AFTER) from None
    return Needs(requires, data.get("cache_tag", ""), data.get("platform", ""),
                 tuple(data.get("extension_suffixes", [])), tuple(data.get("extensions", [])))


def check(release: Path, version: str, python: Path, found_at: Path | None = None) -> None:
    """Refuse (Refused, exit 3) a staged release the interpreter `python` cannot run.

    It runs `python` at `found_at` on this machine (below `--root`) when that differs.
    """
    need = read(release)
    if need is None:
        return
    try:
        node = interpreter.probe(found_at or python)
    except (CouldNotRun, InterpreterUnreadable) as exc:
        why = exc.reason if isinstance(exc, CouldNotRun) else str(exc)
        where = f" (run as {found_at})" if found_at not in (None, python) else ""
        raise ConfigError(f"cannot check release {version} against the config's `python` "
                          f"{python}{where}: {why}; set `python` in the config to the node's Python "
                          f"{'.'.join(map(str, need.requires_python))} or later; "
                          + _AFTER) from None
    what = f"refusing release {version} ({release})"
    if node.version < need.requires_python:
        raise Refused(
            f"{what}: it needs Python {'.'.join(map(str, need.requires_python))} or later, but "
            f"the config's `python` {python} is {'.'.join(map(str, node.version))}; set "
            f"`python` in the config to a newer interpreter; " + _AFTER)
    missing = [s for s in need.extension_suffixes if s not in node.suffixes]
    if missing or (need.extensions and need.platform != node.platform):
        listed = ", ".join(need.extensions[:MAX_LISTED]) + (
            f" and {len(need.extensions) - MAX_LISTED} more"
            if len(need.extensions) > MAX_LISTED else "")
        raise Refused(
            f"{what}: it vendors compiled extensions built for {need.describe()} ({listed}), but "
            f"the config's `python` {python} is {node.describe()} (it loads "
            f"{', '.join(node.suffixes) or 'no extensions'}); pack the release on a machine "
            f"whose Python is the node's ({node.describe()}), or set `python` in the config to "
            f"an interpreter of {need.describe()}; " + _AFTER)
