"""What a packed release carries besides agent-fsm itself: its runtime dependencies, and the
launcher that runs them with the node's own interpreter.

The dependencies are copied from the environment that packs (no network, no resolver): each
installed distribution reachable from RUNTIME_REQUIREMENTS, file by file as its RECORD lists
them below site-packages — its packages and modules, its `*.dist-info` with the license files —
less byte code, `.pth` files, `direct_url.json` (which may name the packing machine's paths)
and whatever it installed outside site-packages (console scripts). A release packed from a
release copies them again from its own `lib/`, which carries the same RECORDs.
"""

from __future__ import annotations

import compileall
import json
import py_compile
import re
import shutil
from importlib import metadata
from pathlib import Path

from ...errors import ReleaseError
from .abi import covers

# agent-fsm's own `dependencies` (pyproject.toml; a test keeps the two equal).
RUNTIME_REQUIREMENTS = ("filelock", "rich", "transitions", "typer")
DEFAULT_PYTHON = "/usr/bin/python3"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SKIPPED_FILES = {"direct_url.json", "INSTALLER", "REQUESTED"}


def _wanted(requirement: str) -> str | None:
    """The distribution a requirement string names, or None when only an extra wants it."""
    name = _NAME.match(requirement.strip())
    if name is None:
        raise ReleaseError(f"cannot read the requirement {requirement!r}")
    marker = requirement.partition(";")[2]
    if re.search(r"\bextra\b", marker):
        return None
    return name.group(0)


def distributions() -> list[metadata.Distribution]:
    """The installed distributions agent-fsm needs at run time, by name, each once.

    A requirement behind an environment marker (`; platform_system == "Windows"`) counts only
    if it is installed here; one without a marker must be (ReleaseError otherwise).
    """
    found: dict[str, metadata.Distribution] = {}
    todo = [(r, "agent-fsm") for r in RUNTIME_REQUIREMENTS]
    while todo:
        requirement, wanted_by = todo.pop()
        name = _wanted(requirement)
        if name is None:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            if ";" in requirement:
                continue  # its marker is false here
            raise ReleaseError(
                f"cannot pack: {name} (needed by {wanted_by}) is not installed in the "
                "environment that packs; install agent-fsm's dependencies first") from None
        key = re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
        if key in found:
            continue
        found[key] = dist
        todo.extend((r, dist.metadata["Name"]) for r in dist.requires or ())
    return [found[k] for k in sorted(found)]


def vendor(lib: Path) -> list[str]:
    """Copy the runtime distributions into `lib`; return their `name==version`, sorted."""
    out = []
    for dist in distributions():
        files = dist.files
        label = f"{dist.metadata['Name']}=={dist.version}"
        if files is None:
            raise ReleaseError(f"cannot pack: {label} has no RECORD of its files")
        for file in files:
            parts = file.parts
            if (not parts or parts[0] == ".." or "__pycache__" in parts
                    or file.suffix in (".pyc", ".pth") or file.name in _SKIPPED_FILES):
                continue
            source = Path(str(file.locate()))
            if not source.is_file():
                raise ReleaseError(f"cannot pack: {label} lists {file}, which is missing")
            target = lib / Path(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
        out.append(label)
    return sorted(out)


# Reads `python = "/path"` from the config before Python runs: a top-level key on its own line,
# before the first table (`config.load` refuses a `python` written any other way).
_READ_PYTHON = (r"""sed -n -e '/^[[:space:]]*\[/q' -e 's/^[[:space:]]*python[[:space:]]*=[[:space:]]*"""
                r""""\([^"]*\)"[[:space:]]*\(#.*\)\{0,1\}$/\1/p'""")

# The interpreter runs isolated (-I: no PYTHON* variables, no user site, no script directory;
# -S: no site-packages of the node; -B: nothing written into the stored release) with the
# release's lib/ first on sys.path. It first checks, in code any Python 2.7 or 3 still parses,
# that it is one the release covers (`abi`: its target, cp313-aarch64, is in TARGETS, or
# TARGETS holds "any"): else one line, before anything vendored is imported.
_BOOT = ("import os, runpy, sys\n"
         "if sys.version_info < (3, 11):\n"
         "    sys.exit(\"agent-fsm: \" + sys.executable + \" is Python \" + sys.version.split()[0]"
         " + \"; a release needs 3.11 or later: set `python` in the config\")\n"
         "target = \"cp%d%d-%s\" % (sys.version_info[0], sys.version_info[1], os.uname()[4])\n"
         "if \"any\" not in {targets} and target not in {targets}:\n"
         "    sys.exit(\"agent-fsm: \" + sys.executable + \" is \" + target + \"; release {version}"
         " covers {covers}: set `python` in the config to one of those\")\n"
         "sys.path.insert(0, sys.argv.pop(1))\n"
         "runpy.run_module(\"agent_fsm\", run_name=\"__main__\", alter_sys=True)\n")

# The python kept with the last-good's settings (`node.assets.kept`, one line of sorted JSON in
# `<state_dir>/last-good-assets.json`, next to the store `<state_dir>/releases/`): the last
# "python" key is the settings' one. Non-ASCII is written as UTF-8 (`KIND.utf8`); an escape still
# there (a `"` or `\` in the path, or a file an older release wrote) is refused, never half-read.
_KEPT_PYTHON = r"""sed -n 's/.*"python":"\([^"]*\)".*/\1/p'"""

LAUNCHER = """#!/bin/sh
# agent-fsm release {version}: runs this release's own agent-fsm and the libraries in its lib/
# with the node's interpreter: the config's `python` (the config is found as agent-fsm finds
# it: --config FILE, else $AGENT_FSM_CONFIG, else /etc/agent-fsm/config.toml), else {default}.
: "${{PATH:=/usr/sbin:/usr/bin:/sbin:/bin}}"
here=$(dirname "$(readlink -f "$0")")
lib=$(dirname "$here")/lib
config=${{AGENT_FSM_CONFIG:-/etc/agent-fsm/config.toml}}
prev=
for arg in "$@"; do
    case $prev in --config) config=$arg ;; esac
    case $arg in --config=*) config=${{arg#--config=}} ;; esac
    prev=$arg
done
python=$({read_python} "$config" 2>/dev/null)
python=${{python:-{default}}}
if [ ! -x "$python" ]; then
    # A wrong `python` in the live config must not stop the way back: the one kept with the
    # last-good's settings, when this release is in a store and the file is the caller's own,
    # writable by no one else.
    releases=$(dirname "$(dirname "$here")")
    kept=$(dirname "$releases")/last-good-assets.json
    good=
    if [ "${{releases##*/}}" = releases ] && [ -n "$(find "$kept" -prune -type f -user "$(id -u)" \
            ! -perm -020 ! -perm -002 2>/dev/null)" ]; then
        good=$({kept_python} "$kept" 2>/dev/null)
    fi
    case $good in *\\\\*)  # a JSON escape: sed does not decode it, and half a path is no path
        printf '%s %s %s\\n' "agent-fsm: the interpreter $python (the config's \\`python\\`) is" \\
            "not executable, and the \\`python\\` kept with the last-good's settings in $kept has" \\
            "a JSON escape (\\\\), which this launcher does not read: fix the config's \\`python\\`" >&2
        exit 1 ;;
    esac
    if [ -z "$good" ] || [ ! -x "$good" ]; then
        echo "agent-fsm: the interpreter $python (the config's \\`python\\`) is not executable" >&2
        exit 1
    fi
    echo "agent-fsm: the interpreter $python (the config's \\`python\\`) is not executable;" \
        "running $good, the \\`python\\` kept with the last-good's settings in $kept" >&2
    python=$good
fi
# Only the release's lib/, never the caller's; no __pycache__ written into the store (a stored
# release never changes: its digest is checked).
export PYTHONPATH="$lib" PYTHONDONTWRITEBYTECODE=1
exec "$python" -I -S -B -c '{boot}' "$lib" "$@"
"""


def launcher(version: str, targets: tuple[str, ...] = ("any",)) -> str:
    """The text of a release's `bin/agent-fsm` for a release covering `targets` (`abi`): no
    path of the packing machine in it."""
    boot = _BOOT.format(targets=json.dumps(list(targets)), version=version,
                        covers=covers(targets))
    assert "'" not in boot, "the launcher quotes it in single quotes"
    return LAUNCHER.format(version=version, default=DEFAULT_PYTHON, read_python=_READ_PYTHON,
                           kept_python=_KEPT_PYTHON, boot=boot)


# What `daemon`, `recover` and `upgrade` import (the fast path): compiled at pack, so that a start
# on the critical path does not compile them again (`-B` forbids writing byte code into the store;
# ~90 ms of CPU a start). Checked-hash .pyc: valid whatever the files' times after the store's
# copy, yet never used for a source that changed; another Python version ignores them.
LEAN_PACKAGES = ("agent_fsm", "transitions", "filelock")


def compile_lean(release: Path) -> None:
    """Byte-compile the fast path's packages in `release`/lib, naming sources relative to the
    release (no path of the packing machine inside)."""
    for name in LEAN_PACKAGES:
        package = release / "lib" / name
        if package.is_dir() and not compileall.compile_dir(
                package, quiet=2, stripdir=str(release), workers=1,
                invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH):
            raise ReleaseError(f"cannot pack: byte-compiling {package} failed")
