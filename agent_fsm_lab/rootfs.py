"""A Debian 13 node for end-to-end tests: a root file system made with debootstrap, cached.

`ensure_rootfs` returns the root file system of a Debian 13 ("trixie") node, systemd 257 and
CPython 3.13, that `SystemdSandbox(rootfs=...)` boots::

    debootstrap --variant=minbase --include=systemd,systemd-sysv,python3,dbus,util-linux,procps,\
        openssh-client trixie DIR MIRROR

openssh-client: its ssh-keygen checks a followed channel's signatures, on a node as anywhere.

MIRROR is the Debian mirror this machine's apt sources already name (`mirror`), never a host
written here; ``AGENT_FSM_TEST_MIRROR`` overrides it.  The tree is built once into `CACHE_DIR`
(outside any checkout: ~400 MB), as ``trixie-<hash of RECIPE>/``: built in a hidden sibling
and renamed into place, under a lock, so parallel test workers and two checkouts build it once.
A missing tree, or a changed recipe (a new name), is built again; older trees are left for the
operator (``rm -r /var/cache/agent-fsm-tests`` frees them all).

Releases packed by the harness, on this machine's Python, run on the node's own Python 3.13 as
on any node of the fleet: they are pure Python (docs/operations.md, the support matrix).
Nothing is installed in the node but Debian's own packages; the node's releases vendor their
dependencies as every release does.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from .sandbox import SystemdSandbox

CACHE_DIR: Final = Path(os.environ.get("AGENT_FSM_TEST_CACHE", "/var/cache/agent-fsm-tests"))
SUITE: Final = "trixie"
PACKAGES: Final = ("systemd", "systemd-sysv", "python3", "dbus", "util-linux", "procps",
                   "openssh-client")
# What the tree must answer once built (its `systemctl --version`, its `python3 --version`).
SYSTEMD_VERSION: Final = 257
PYTHON_VERSION: Final = (3, 13)
# Bumped whenever the steps after debootstrap change what the tree holds.
RECIPE_REVISION: Final = 1
RECIPE: Final[dict[str, Any]] = {
    "suite": SUITE,
    "variant": "minbase",
    "include": list(PACKAGES),
    "revision": RECIPE_REVISION,
}
STAMP: Final = ".agent-fsm-rootfs.json"  # written last into a finished tree
LOCK_WAIT: Final = 900.0  # seconds to wait for another process's build
BUILD_TIMEOUT: Final = 1200.0


class RootfsError(RuntimeError):
    """The node's root file system could not be built or read; the message says why."""


@dataclass(frozen=True)
class Node:
    """A built node: its root file system and what the lab needs of it."""

    rootfs: Path
    systemd: str  # e.g. "systemd 257 (257.9-1~deb13u1)"
    python: str  # e.g. "3.13.5"
    seconds: float  # how long its build took (read from its stamp)


def recipe_hash() -> str:
    return hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode()).hexdigest()[:12]


def rootfs_dir(cache: Path = CACHE_DIR) -> Path:
    return cache / f"{SUITE}-{recipe_hash()}"


# The mirror -------------------------------------------------------------------------------
def mirror(apt_dir: Path = Path("/etc/apt")) -> str:
    """The Debian mirror the machine's apt sources name (the first `deb` source that is not a
    security one); ``AGENT_FSM_TEST_MIRROR`` overrides it. RootfsError when there is none."""
    override = os.environ.get("AGENT_FSM_TEST_MIRROR")
    if override:
        return override
    for uri in _source_uris(apt_dir):
        if "security" not in uri and urllib.parse.urlparse(uri).scheme in ("http", "https"):
            return uri
    raise RootfsError(
        f"no Debian mirror in {apt_dir}/sources.list.d/*.sources (`URIs:`) or "
        f"{apt_dir}/sources.list (`deb URI ...`); name one in AGENT_FSM_TEST_MIRROR")


def _source_uris(apt_dir: Path) -> Iterator[str]:
    for path in sorted((apt_dir / "sources.list.d").glob("*.sources")):
        with contextlib.suppress(OSError):
            for stanza in re.split(r"\n\s*\n", path.read_text()):
                fields = dict(re.findall(r"^([A-Za-z-]+):[ \t]*(.*)$", stanza, re.M))
                if "deb" in fields.get("Types", "").split() \
                        and fields.get("Enabled", "yes").lower() != "no":
                    yield from fields.get("URIs", "").split()
    lists = [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*.list"))]
    for path in lists:
        with contextlib.suppress(OSError):
            for line in path.read_text().splitlines():
                words = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0]).split()
                if len(words) >= 2 and words[0] == "deb":
                    yield words[1]


def _reachable(uri: str, timeout: float = 5.0) -> str | None:
    """None when the mirror's host answers on its port, else why not."""
    parts = urllib.parse.urlparse(uri)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "", port), timeout):
            return None
    except OSError as exc:
        return f"the network: the mirror {uri} did not answer ({exc})"


# What is missing ---------------------------------------------------------------------------
def missing_requirements(cache: Path = CACHE_DIR) -> list[str]:
    """What this machine lacks to build (or use the cached) node, one item each; empty: none.

    A cached tree needs nothing more; building one needs `debootstrap`, a mirror and the
    network.
    """
    missing: list[str] = []
    built = (rootfs_dir(cache) / STAMP).is_file()
    if not built and shutil.which("debootstrap", path=_PATH) is None:
        missing.append("the `debootstrap` program (apt-get install debootstrap; "
                       "`make system-packages` does it)")
    if not built:
        try:
            why = _reachable(mirror())
        except RootfsError as exc:
            why = str(exc)
        if why is not None:
            missing.append(why)
    return missing


_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


# Building ----------------------------------------------------------------------------------
@contextlib.contextmanager
def _locked(path: Path, wait: float = LOCK_WAIT) -> Iterator[None]:
    """An exclusive flock on `path` (created), waited for at most `wait` seconds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RootfsError(f"another process held {path} for over {wait:.0f}s "
                                      "(a build still running?); try again later") from None
                time.sleep(0.5)
        yield
    finally:
        os.close(fd)


def _run(argv: list[str], timeout: float, what: str) -> str:
    """Run `argv`, its output captured, in a small fixed environment."""
    env = {"PATH": _PATH, "LANG": "C.UTF-8"}
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                              check=False)
    except subprocess.TimeoutExpired:
        raise RootfsError(f"{what}: `{' '.join(argv)}` ran over {timeout:.0f}s") from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
        raise RootfsError(f"{what}: `{' '.join(argv)}` exited {proc.returncode}:\n{tail}")
    return proc.stdout


def _in_tree(tree: Path, *argv: str) -> str:
    return _run(["chroot", str(tree), *argv], 60, f"checking {tree}").strip()


def _sweep(final: Path) -> None:
    """Remove hidden half-built siblings of `final` (a build that died); the caller holds the
    lock, so none is being built."""
    for stale in final.parent.glob(f".{final.name}.*.building"):
        if not _has_mounts(stale):  # debootstrap ran in its own mount namespace: never
            shutil.rmtree(stale, ignore_errors=True)


def _has_mounts(path: Path) -> bool:
    prefix = str(path.resolve()) + "/"
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            if (line.split()[4] + "/").startswith(prefix):
                return True
    return False


def ensure_rootfs(cache: Path = CACHE_DIR) -> Node:
    """The cached node, built first if it is missing (see the module docstring)."""
    final = rootfs_dir(cache)
    if not (final / STAMP).is_file():
        with _locked(cache / f"{final.name}.lock"):
            if not (final / STAMP).is_file():  # another process may have built it meanwhile
                _build(final)
    return _read(final)


def _build(final: Path) -> None:
    missing = missing_requirements(final.parent)
    if missing:
        raise RootfsError("cannot build the Debian 13 node; missing: " + "; ".join(missing))
    _sweep(final)
    if final.exists():  # no stamp: an unfinished tree from before atomic builds, or damaged
        shutil.rmtree(final)
    tmp = final.with_name(f".{final.name}.{os.getpid()}.building")
    source = mirror()
    started = time.monotonic()
    # In a mount namespace of its own: whatever debootstrap mounts inside the tree (proc, sys)
    # goes away with it, even if it is killed.
    argv = ["unshare", "--mount", "--propagation", "private",
            "debootstrap", f"--variant={RECIPE['variant']}",
            f"--include={','.join(RECIPE['include'])}", str(RECIPE["suite"]), str(tmp), source]
    try:
        _run(argv, BUILD_TIMEOUT, "building the Debian 13 node")
        systemd = _in_tree(tmp, "/lib/systemd/systemd", "--version").splitlines()[0]
        python = _in_tree(tmp, "python3", "-c",
                          "import sys; print('.'.join(map(str, sys.version_info[:3])))")
        if not systemd.startswith(f"systemd {SYSTEMD_VERSION} ") \
                or tuple(map(int, python.split(".")[:2])) != PYTHON_VERSION:
            raise RootfsError(f"the tree built in {tmp} has {systemd!r} and Python {python}; "
                              f"the recipe expects systemd {SYSTEMD_VERSION} and Python "
                              f"{'.'.join(map(str, PYTHON_VERSION))}")
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp / "var" / "cache" / "apt" / "archives", ignore_errors=True)
            (tmp / "var" / "cache" / "apt" / "archives" / "partial").mkdir(parents=True)
        stamp = {"recipe": RECIPE, "mirror": source, "systemd": systemd, "python": python,
                 "seconds": round(time.monotonic() - started, 1),
                 "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (tmp / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
        os.replace(tmp, final)
    except BaseException:
        if not _has_mounts(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def _read(final: Path) -> Node:
    try:
        stamp = json.loads((final / STAMP).read_text())
        return Node(final, str(stamp["systemd"]), str(stamp["python"]), float(stamp["seconds"]))
    except (OSError, ValueError, KeyError) as exc:
        raise RootfsError(f"{final / STAMP} is unreadable ({exc}); remove {final} and run "
                          "the tests again to rebuild it") from None


def main(argv: list[str] | None = None) -> int:
    """`python -m agent_fsm_lab.rootfs [--if-possible]`: build (or find) the node and say where
    it is; with `--if-possible`, a machine that cannot build it (no debootstrap, no network, not
    root) is told what is missing and the exit status is still 0 (the tests then skip, or fail
    under CI=true)."""
    args = sys.argv[1:] if argv is None else argv
    if args and args != ["--if-possible"]:
        print("usage: python -m agent_fsm_lab.rootfs [--if-possible]", file=sys.stderr)
        return 2
    if args:
        missing = missing_requirements()
        if os.geteuid() != 0 and not (rootfs_dir() / STAMP).is_file():
            missing.append(f"root privileges (running as uid {os.geteuid()})")
        if missing:
            print("the Debian 13 node is not built; missing: " + "; ".join(missing))
            return 0
    started = time.monotonic()
    try:
        node = ensure_rootfs()
    except RootfsError as exc:
        print(f"agent_fsm_lab.rootfs: {exc}", file=sys.stderr)
        return 1
    print(f"{node.rootfs}: {node.systemd}, Python {node.python} (built in {node.seconds:.0f}s)")
    print(f"ready in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())


def sandbox(node: Node, base_dir: Path | None = None, keep: Iterable[Path] = ()) -> SystemdSandbox:
    """A sandbox (not booted) of the node: its tree, with the agent_fsm checkout the lab runs
    the CLI from and the directories in `keep` visible (read-only) at the same path inside."""
    import agent_fsm

    kept = [Path(agent_fsm.__file__).resolve().parents[1], *keep]
    if base_dir is None:
        return SystemdSandbox(keep=kept, rootfs=node.rootfs)
    return SystemdSandbox(base_dir, keep=kept, rootfs=node.rootfs)
