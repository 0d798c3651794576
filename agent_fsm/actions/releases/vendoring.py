"""What a packed release carries besides agent-fsm itself: its runtime dependencies, and the
launcher that runs them with the node's own interpreter.

The dependencies are copied from the packing environment, with no network and no resolver. Each
installed distribution reachable from RUNTIME_REQUIREMENTS is copied file by file as its RECORD
lists them below site-packages (packages, modules, `*.dist-info` with license files). Left out: byte
code, `.pth` files, `direct_url.json` (it may name the packing machine's paths) and anything
installed outside site-packages (console scripts). A release packed from a release copies them from
its own `lib/`, which carries the same RECORDs.
"""

from __future__ import annotations

import compileall
import json
import logging
import py_compile
import re
import shutil
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from ...errors import CouldNotRun, ReleaseError
from ...system import proc
from .abi import covers

# agent-fsm's own `dependencies` (pyproject.toml; a test keeps the two equal).
RUNTIME_REQUIREMENTS = ("filelock", "rich", "transitions", "typer")
DEFAULT_PYTHON = "/usr/bin/python3"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SKIPPED_FILES = {"direct_url.json", "INSTALLER", "REQUESTED"}
_log = logging.getLogger("agent_fsm")


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
    """The installed distributions agent-fsm needs at run time, by name, each once. A requirement
    behind an environment marker (`; platform_system == "Windows"`) counts only if installed here;
    one without a marker must be installed (ReleaseError otherwise)."""
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


def sources() -> list[tuple[Path, str]]:
    """Each file `vendor` copies, and its path below `lib/`."""
    out = []
    for dist in distributions():
        listed = dist.files
        label = f"{dist.metadata['Name']}=={dist.version}"
        if listed is None:
            raise ReleaseError(f"cannot pack: {label} has no RECORD of its files")
        for file in listed:
            parts = file.parts
            if (not parts or parts[0] == ".." or "__pycache__" in parts
                    or file.suffix in (".pyc", ".pth") or file.name in _SKIPPED_FILES):
                continue
            source = Path(str(file.locate()))
            if not source.is_file():
                raise ReleaseError(f"cannot pack: {label} lists {file}, which is missing")
            out.append((source, "/".join(parts)))
    return out


def vendor(lib: Path, files: list[tuple[Path, str]] | None = None) -> None:
    """Copy the runtime distributions' files (`sources`, unless given) into `lib`."""
    for source, rel in sources() if files is None else files:
        target = lib / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)


# Reads `python = "/path"` from the config before Python runs, as TOML reads it or not at all.
# Before the first table header or line holding `{`, `"""` or `'''`, only an array spans lines (and
# holds no key) and every key is the root table's, so a line `python = "..."` there (a basic string
# without escapes or control characters, an optional comment) is the key itself, its value the bytes
# between the quotes. The first `python =` line ends the reading, taken or not. `config.load`
# refuses a file this reads otherwise than TOML.
_READ_PYTHON = ("LC_ALL=C sed -n -e '/^[[:space:]]*\\[/q' -e '/{/q' -e '/\"\"\"/q' -e \"/'''/q\" "
                "-e '/^[[:space:]]*python[[:space:]]*=/{' -e 's/^[[:space:]]*python[[:space:]]*="
                "[[:space:]]*\"\\([^\"\\\\[:cntrl:]]*\\)\"[[:space:]]*\\(#.*\\)\\{0,1\\}$/\\1/p' "
                "-e q -e '}'")

# The program the launcher runs, `lib/agent-fsm-boot.py` (a file, so `ps` and `systemctl status`
# show a short command line). The interpreter runs isolated (-I: no PYTHON* variables, no user site;
# -S: no node site-packages; -B: nothing written into the stored release) with the release's lib/
# first on sys.path. It first checks, in code Python 2.7 and 3 both parse, that the release covers
# it (`abi`: its target, e.g. cp313-aarch64, is in TARGETS, or TARGETS holds "any"); else one line,
# before anything vendored is imported.
BOOT_FILE = "agent-fsm-boot.py"
_BOOT = ("# agent-fsm release {version}: what bin/agent-fsm runs (see there).\n"
         "import os, runpy, sys\n"
         "if sys.version_info < (3, 11):\n"
         "    sys.exit(\"agent-fsm: \" + sys.executable + \" is Python \" + sys.version.split()[0]"
         " + \"; a release needs 3.11 or later: set `python` in the config\")\n"
         "target = \"cp%d%d-%s\" % (sys.version_info[0], sys.version_info[1], os.uname()[4])\n"
         "if \"any\" not in {targets} and target not in {targets}:\n"
         "    sys.exit(\"agent-fsm: \" + sys.executable + \" is \" + target + \"; release {version}"
         " covers {covers}: set `python` in the config to one of those\")\n"
         "sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))\n"
         "runpy.run_module(\"agent_fsm\", run_name=\"__main__\", alter_sys=True)\n")

# The python kept with the settings the node last read valid (`node.assets.kept`): one absolute path
# on one line, in the stored release's state dir (`<state_dir>/releases/<version>`).
KEPT_PYTHON = "last-good-python"

LAUNCHER = """#!/bin/sh
# agent-fsm release {version}: runs this release's own agent-fsm and the libraries in its lib/
# with the node's interpreter: the config's `python` (the config is found as agent-fsm finds
# it: a leading --config FILE, else $AGENT_FSM_CONFIG, else /etc/agent-fsm/config.toml), else
# {default}.
: "${{PATH:=/usr/sbin:/usr/bin:/sbin:/bin}}"
me=$(readlink -f "$0")
here=${{me%/*}}
top=${{here%/*}}
lib=$top/lib
releases=${{top%/*}}
state=${{releases%/*}}
if [ -O / ]; then uid=0; else uid=$(id -u); fi
visible() {{ printf '%s' "$1" | LC_ALL=C tr '\\000-\\037\\177' '?'; }}
# No code of this release runs before its tree is proven root's (or the caller's) alone: every
# directory from / down to the release owned so and writable by no one else, or sticky (no one
# else can rename or remove root's entries in /tmp); and bin/ and lib/, what runs, owned so,
# writable by no one else, nothing but files and directories. In a store whose state dir is
# closed to others (`<state_dir>/releases/<version>`), no one else can reach a file below, and
# agent-fsm wrote each one so (`node.releases.store`): that walk is spared on every start.
stored=
if [ "${{releases##*/}}" = releases ] \\
        && [ -n "$(find "$state" -maxdepth 0 ! -perm /077 -print 2>/dev/null)" ]; then
    stored=yes
fi
unsafe() {{
    p=$top
    set --
    while [ -n "$p" ]; do set -- "$@" "$p"; p=${{p%/*}}; done
    find / "$@" -maxdepth 0 \\( ! -user 0 ! -user "$uid" -o -perm /022 ! \\( -type d -perm -1000 \\) \\) \\
        -print -quit 2>/dev/null || echo "$top"
    [ -n "$stored" ] || find "$here" "$lib" \\( ! -user 0 ! -user "$uid" -o -perm /022 \\
        -o ! -type f ! -type d \\) -print -quit 2>/dev/null || echo "$lib"
}}
bad=$(unsafe)
if [ -n "$bad" ]; then
    echo "agent-fsm: refusing to run release $(visible "$top"): $(visible "${{bad%%
*}}") is not root's alone (another user owns it, others may write it, or it is a link);" \\
        "unpack releases into a new directory only root can write (d=\\$(mktemp -d))" >&2
    exit 1
fi
config=${{AGENT_FSM_CONFIG:-/etc/agent-fsm/config.toml}}
configured() {{  # the global options, before the command, as agent-fsm reads them
    while [ $# -gt 0 ]; do
        case $1 in
            --config|--root) [ "$1" = --root ] || config=${{2-}}; shift; [ $# -eq 0 ] || shift ;;
            --config=*) config=${{1#--config=}}; shift ;;
            --) return ;;
            -*) shift ;;
            *) return ;;
        esac
    done
}}
configured "$@"
python=$({read_python} "$config" 2>/dev/null)
python=${{python:-{default}}}
if [ ! -x "$python" ]; then
    # A wrong `python` in the live config must not stop the way back: the one kept with the
    # settings the node last read valid, when this release is in a store and the file is the
    # caller's own, writable by no one else (its directories are proven above).
    kept=$state/{kept_python}
    good=
    if [ -n "$stored" ] && [ -n "$(find "$kept" -prune -type f -user "$uid" ! -perm /022 \\
            2>/dev/null)" ]; then
        IFS= read -r good < "$kept" || good=
    fi
    case $good in /*) ;; *) good= ;; esac
    if [ -z "$good" ] || [ ! -x "$good" ]; then
        echo "agent-fsm: the interpreter $(visible "$python") (the config's \\`python\\`) is not" \\
            "executable" >&2
        exit 1
    fi
    echo "agent-fsm: the interpreter $(visible "$python") (the config's \\`python\\`) is not" \\
        "executable; running $(visible "$good"), the \\`python\\` kept with the" \\
        "last-good's settings in $(visible "$kept")" >&2
    python=$good
fi
# Only the release's lib/, never the caller's; no __pycache__ written into the store (a stored
# release never changes: its digest is checked).
export PYTHONPATH="$lib" PYTHONDONTWRITEBYTECODE=1
exec "$python" -I -S -B "$lib/{boot_file}" "$@"
"""


def launcher(version: str) -> str:
    """The text of a release's `bin/agent-fsm`: no path of the packing machine in it."""
    return LAUNCHER.format(version=version, default=DEFAULT_PYTHON, read_python=_READ_PYTHON,
                           kept_python=KEPT_PYTHON, boot_file=BOOT_FILE)


def boot(version: str, targets: tuple[str, ...] = ("any",)) -> str:
    """The text of a release's `lib/agent-fsm-boot.py` for a release covering `targets`."""
    return _BOOT.format(targets=json.dumps(list(targets)), version=version,
                        covers=covers(targets))


# What `daemon`, `recover` and `upgrade` import (the fast path), compiled at pack for the packing
# Python and at add for the node's (`compile_for`), so a start on the critical path need not (`-B`
# forbids writing byte code into the store; 70-110 ms of CPU a start). Checked-hash .pyc: valid
# whatever the files' times after the store's copy, never used for a changed source; another Python
# version ignores them. `six` is a module, not a package (transitions imports it).
LEAN_PACKAGES = ("agent_fsm", "transitions", "filelock", "six")


def compile_lean(release: Path) -> None:
    """Byte-compile the fast path's packages and modules in `release`/lib, naming sources relative
    to the release (no path of the packing machine inside)."""
    mode = py_compile.PycInvalidationMode.CHECKED_HASH
    for name in LEAN_PACKAGES:
        package, module = release / "lib" / name, release / "lib" / f"{name}.py"
        if package.is_dir():
            source = package
            done = compileall.compile_dir(package, quiet=2, stripdir=str(release), workers=1,
                                          invalidation_mode=mode)
        elif module.is_file():
            source = module
            done = compileall.compile_file(module, quiet=2, stripdir=str(release),
                                           invalidation_mode=mode)
        else:
            continue
        if not done:
            raise ReleaseError(f"cannot pack: byte-compiling {source} failed")


# Run by the node's `python` on a staged release: the fast path's sources that have no byte code for
# it get checked-hash .pyc, named as at pack. Isolated (-I -S), it imports the standard library only;
# compiling runs none of the release's code.
_COMPILE = """\
import importlib.util, os, py_compile, sys
os.umask(0o022)
top = sys.argv[1]
for name in sys.argv[2:]:
    where = os.path.join(top, "lib", name)
    found = [where + ".py"] if os.path.isfile(where + ".py") else [
        os.path.join(d, f) for d, _, fs in os.walk(where) for f in sorted(fs) if f.endswith(".py")]
    for path in found:
        cfile = importlib.util.cache_from_source(path)
        if not os.path.exists(cfile):
            py_compile.compile(path, cfile, os.path.relpath(path, top), quiet=1,
                               invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
"""
COMPILE_TIMEOUT = 300.0


def compile_for(python: Path) -> Callable[[Path], None]:
    """What writes the fast path's byte code for `python` into a staged release (`release add`).
    A failure (logged) stores the release without it: its starts compile from source."""
    def compile_lib(release: Path) -> None:
        if not (release / "lib" / "agent_fsm").is_dir():
            return  # no agent-fsm of its own: nothing on the fast path to compile
        try:
            done = proc.run([str(python), "-I", "-S", "-c", _COMPILE, str(release),
                             *LEAN_PACKAGES], timeout=COMPILE_TIMEOUT, cwd="/")
        except CouldNotRun as exc:
            _log.warning("no byte code for %s: %s", python, exc)
            return
        if done.returncode != 0:
            _log.warning("no byte code for %s: it exited %d: %s", python, done.returncode,
                         done.tail or "no output")
    return compile_lib
