"""Making and adding releases: `release pack`, `release add` (`release prune`: `pruning`).

A packed release runs on its own with the node's `python3`. `lib/` holds the agent_fsm package that
packed it and its runtime dependencies (`vendoring`). `bin/agent-fsm` runs them with the config's
interpreter. `assets/` holds the service assets' templates. `payload/` (with `--payload SRC`) holds
the user's own agent, copied as the store copies a release (`node.releases.tree`), so the digest and
the pack's signature cover it too.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ... import files
from ...errors import AssetError, BadTree, Refused, ReleaseError, UnsafePath
from ...node.assets import render as assets
from ...node.releases import store as release_store
from ...node.releases import tree
from ...node.releases import workload as workload_command
from ...node.releases.moving import Meter, Report
from ...node.releases.pointers import check_version, read_manifest
from ...node.sha256 import prefer_openssl
from ...wiring import Node
from . import abi, libcache, origins, trust
from .vendoring import BOOT_FILE, boot, compile_for, compile_lean, sources, vendor
from .vendoring import launcher as launcher_text

PACKAGE_DIR = Path(__file__).resolve().parents[2]  # the agent_fsm package


def _ignore(_dir: str, names: list[str]) -> list[str]:
    return [n for n in names if n in ("__pycache__",) or n.endswith(".pyc")]


def pack(version: str, output: Path, workload: tuple[str, ...] = (),
         sign_key: Path | None = None, targets: tuple[str, ...] = abi.FLEET,
         payload: Path | None = None, report: Report | None = None) -> Path:
    """`packed` (which see), returning the release's path alone."""
    return packed(version, output, workload, sign_key, targets, payload, report).path


@dataclass(frozen=True)
class Packed:
    path: Path
    digest: str  # what `release digest` prints for it (`trust.digest`)


def packed(version: str, output: Path, workload: tuple[str, ...] = (),
           sign_key: Path | None = None, targets: tuple[str, ...] = abi.FLEET,
           payload: Path | None = None, report: Report | None = None) -> Packed:
    """Write a release directory for `version` at `output`, which must not exist. It holds what it
    needs of the node's `python` (`abi`), and `payload`'s tree as `payload/` if given
    (`copy_payload`, reporting to `report`). It is signed with `sign_key` if given (`trust`).
    ReleaseError when it would not cover all of `targets` (`abi.FLEET`: the fleet's). A failure
    leaves nothing at or beside `output`.

    No other user can plant or swap a file. `output`'s name is taken first (an empty 0700 directory,
    made exclusively). The release is made in a `files.private_dir` beside it with the store's modes
    (nothing group- or world-writable), then renamed over that name whole. Its parent must be a
    `files.trusted_dir` (a sticky one such as /tmp is); one others may write is refused. Nothing is
    synced, as with `cp -a`: a release torn by a power cut is packed again (docs/operations.md,
    Releases).
    """
    check_version(version)
    workload_command.check(workload, "release pack --workload")
    targets = abi.parse_targets(targets)
    where = _trusted_parent(output)
    real = where / output.name
    try:
        files.make_dir(real, 0o700)  # the name is ours from here on
    except FileExistsError:
        raise ReleaseError(f"{output} already exists; pack into a new directory") from None
    except OSError as exc:
        raise files.disk_error(exc, f"create {output}", where) from exc
    renamed = False
    try:
        with files.private_dir(where, f".{real.name}.packing.") as holder:
            tmp = holder / "release"
            signed = _make(tmp, version, workload, sign_key, targets, payload, output, report)
            os.replace(tmp, real)  # over the empty directory that held the name
            renamed = True
    except BaseException as exc:
        if not renamed:  # else the release is whole; what failed after is the news
            try:
                os.rmdir(real)
            except OSError as left:
                raise files.disk_error(left, f"remove {real}", where,
                                       f"left by a pack that failed: {exc}") from exc
        raise
    return Packed(output, signed)


def _trusted_parent(output: Path) -> Path:
    """The real path of `output`'s parent, made (0755) if missing; ReleaseError, one line, when
    another user could swap what is written there."""
    if output.name in ("", ".", ".."):
        raise ReleaseError(f"--output {output}: name the new directory to pack into")
    parent = output.parent.absolute()
    try:
        existing = parent
        while not os.path.lexists(existing):
            existing = existing.parent
        files.trusted_dir(existing)  # before anything is made below it
        files.ensure_dir(parent)
        return files.trusted_dir(parent)
    except UnsafePath as exc:
        raise ReleaseError(f"refusing to pack into {output}: {exc}; nothing was packed") from None
    except OSError as exc:
        raise ReleaseError(f"cannot pack into {output}: {exc.filename or output.parent}: "
                           f"{exc.strerror or exc}; nothing was packed") from None


def _make(tmp: Path, version: str, workload: tuple[str, ...], sign_key: Path | None,
          targets: tuple[str, ...], payload: Path | None, output: Path,
          report: Report | None = None) -> str:
    """Make the release in the new directory `tmp` inside a private one (see `pack`); its digest.
    `lib/` is made on a thread of its own while the payload is copied (`_beside`). The payload's
    files are hashed as copied and `lib/`'s as the cache checks them (`libcache`). Neither is read
    again: `tmp` is in a directory only this user may enter, and a changed file has
    another stat (`tree.scan`)."""
    prefer_openssl()  # a payload may be gigabytes, hashed once: OpenSSL's is the fast one
    hashed: tree.Hashed = {}
    if payload is not None:
        check_payload(payload, output, tmp)
    (tmp / "bin").mkdir(parents=True)
    libs: tree.Hashed = {}
    with _beside(lambda: _make_lib(tmp / "lib", libs)):  # the payload's error is raised first
        if payload is not None:
            copied: tree.Hashed = {}
            copy_payload(payload, tmp / PAYLOAD, copied, report, f"{version} ({payload})")
            for (rel, stamp), entry in copied.items():
                hashed[f"{PAYLOAD}/{rel}", stamp] = entry._replace(path=f"{PAYLOAD}/{rel}")
            del copied
    for (rel, stamp), entry in libs.items():  # hashed by the cache's check: not read again
        hashed[f"lib/{rel}", stamp] = entry._replace(path=f"lib/{rel}")
    need = abi.record(tmp, targets)
    shutil.copytree(PACKAGE_DIR / "templates", tmp / "assets")
    launcher = tmp / "bin" / "agent-fsm"
    launcher.write_text(launcher_text(version))
    launcher.chmod(0o755)
    with open(tmp / "lib" / BOOT_FILE, "x") as f:  # a new file: lib/'s others may be the cache's
        f.write(boot(version, need.targets))
    manifest = f'version = "{version}"\n'
    if workload:
        manifest += "workload = [" + ", ".join(_toml_str(a) for a in workload) + "]\n"
    (tmp / "release.toml").write_text(manifest)
    _settle_modes(tmp, PAYLOAD)
    if sign_key is not None:  # last: the signature covers everything else, payload included
        return trust.sign(tmp, sign_key, hashed)
    return trust.digest(tmp, hashed)  # what `release add` would refuse (over the limits) too


@contextlib.contextmanager
def _beside(job: Callable[[], object]) -> Iterator[None]:
    """Run `job` on a thread of its own while the block runs, joined when the block ends. The
    block's error is raised, else the job's. A payload's copy mostly waits on the kernel and
    OpenSSL, which release the GIL, so the two overlap."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            job()
        except BaseException as exc:  # raised by the thread that packs
            failed.append(exc)

    thread = threading.Thread(target=run, name="agent-fsm-lib", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()  # before anything it writes is removed
    if failed:
        raise failed[0]


def _make_lib(lib: Path, hashed: tree.Hashed) -> None:
    """Make the release's `lib/` at the new path `lib`, from the cache when it can (`libcache`);
    its files' hashes go in `hashed`."""
    vendored = sources()
    libcache.made(lib, [*_package_files(), *vendored], lambda new: _build_lib(new, vendored),
                  hashed)


def _package_files() -> list[tuple[Path, str]]:
    """The files of this agent_fsm package a release's `lib/agent_fsm` holds, and their paths below
    `lib/`. Links are followed, so the copy holds the definition itself (`agent_fsm/states`)."""
    out = []
    for top, dirs, names in os.walk(PACKAGE_DIR, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d not in _ignore(top, dirs))
        rel = os.path.relpath(top, PACKAGE_DIR)
        for name in sorted(set(names) - set(_ignore(top, names))):
            out.append((Path(top) / name,
                        "agent_fsm/" + (name if rel == "." else f"{rel}/{name}")))
    return out


def _build_lib(lib: Path, vendored: list[tuple[Path, str]]) -> None:
    """Make a release's `lib/` (`lib` is the new directory's path): this package, its runtime
    dependencies, the fast path's byte code."""
    shutil.copytree(PACKAGE_DIR, lib / "agent_fsm", ignore=_ignore)
    vendor(lib, vendored)
    compile_lean(lib.parent)
    _settle_modes(lib)  # before the cache links its files: no chmod of them later


def _settle_modes(release: Path, settled: str | None = None) -> None:
    """Give every entry of the release being packed the store's mode (0755 for directories and
    executables, else 0644), whatever the umask or sources. The directory `settled` at its top is
    left out: copied with those modes already (`copy_payload`). Links are not followed:
    `trust.digest` refuses them."""
    for top, dirs, names in os.walk(release):
        if top == str(release) and settled in dirs:
            dirs.remove(settled)
        for name in (*dirs, *names):
            path = os.path.join(top, name)
            st = os.lstat(path)
            if not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) != tree.normal_mode(st):
                os.chmod(path, tree.normal_mode(st))  # (a file left as it is keeps its ctime)
    os.chmod(release, tree.DIR_MODE)


PAYLOAD = "payload"  # the release's directory for the user's own agent


def check_payload(src: Path, output: Path, tmp: Path) -> None:
    """Refuse in one line a `--payload` that is missing, not a directory, or holds the release being
    packed (it would copy itself)."""
    if not src.exists():
        raise ReleaseError(f"--payload {src} does not exist; give the directory whose tree "
                           f"goes into the release as {PAYLOAD}/; nothing was packed")
    if not src.is_dir():
        raise ReleaseError(f"--payload {src} is not a directory; put the file in a directory "
                           f"and give that (its tree goes into the release as {PAYLOAD}/); "
                           "nothing was packed")
    real = src.resolve()
    for inside in (output, tmp):
        if inside.resolve().is_relative_to(real):
            raise ReleaseError(f"--payload {src} holds the release being packed ({output}); "
                               "pack into a directory outside it; nothing was packed")


def copy_payload(src: Path, dst: Path, hashed: tree.Hashed | None = None,
                 report: Report | None = None, shown: str = "") -> None:
    """Copy `src`'s tree to `dst` as the store copies a release: regular files and directories only,
    nothing followed, modes 0755 (directories, executables) or 0644, within the limits. A setuid or
    setgid file is refused, not stripped, since its program would fail only on the node.
    ReleaseError names the path. `hashed` is filled with the files' hashes (`tree.copy`). `report`
    is told the progress, naming it `shown`."""
    count = size = 0
    for top, _dirs, names in os.walk(src):
        for name in names:
            path = os.path.join(top, name)  # strings: a payload may hold 100,000s of files
            st = os.lstat(path)
            count, size = count + 1, size + st.st_size
            if stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                bit = "setuid" if st.st_mode & stat.S_ISUID else "setgid"
                raise ReleaseError(
                    f"cannot pack --payload {src}: {path} is {bit} (mode "
                    f"{stat.S_IMODE(st.st_mode):04o}); a release never holds setuid or setgid "
                    "files (the store would not keep the bit): clear it (`chmod ug-s`) and have "
                    "the service's unit or the host grant what it needs; nothing was packed")
    meter = None if report is None else Meter(report, "packing", shown or str(src), count, size)
    try:
        tree.copy(src, dst, hashed=hashed, meter=meter)
    except BadTree as exc:
        raise ReleaseError(
            f"cannot pack --payload {src}: {exc}; a release holds regular files and "
            "directories only, within the store's limits (docs/operations.md, Releases); "
            "nothing was packed") from None
    except OSError as exc:  # unreadable: a file or directory of SRC this user may not read
        raise ReleaseError(f"cannot pack --payload {src}: {exc}; nothing was packed") from None
    os.chmod(dst, tree.DIR_MODE)  # `copy` leaves its top 0700
    if meter is not None:
        meter.done()


def _toml_str(s: str) -> str:
    """A TOML basic string. JSON's escapes are TOML's (a newline in a `sh -c` script is `\\n`), and
    DEL is escaped too, as TOML wants."""
    return json.dumps(s, ensure_ascii=False).replace("\x7f", "\\u007f")


@dataclass(frozen=True)
class Added:
    version: str
    path: Path
    already: bool  # the same content was stored already
    digest: str = ""
    replaced: str | None = None  # why a stored copy of the same content was replaced
    image: origins.Image | None = None  # the image it came from (`sources.add_source`)


def validate(directory: Path, node: Node) -> str:
    """Check a staged (so normalized) release directory before it is stored; its version."""
    manifest = directory / "release.toml"
    try:
        version = read_manifest(manifest).version
    except FileNotFoundError:
        raise ReleaseError(f"{directory} is not a release: {manifest} is missing") from None
    trust.check(directory, version, node.config, node.paths)  # who made it, before anything else
    launcher = directory / "bin" / "agent-fsm"
    if not launcher.is_file() or not os.access(launcher, os.X_OK):
        raise ReleaseError(f"release {version} has no executable {launcher}")
    assets.render(directory, node.paths, version)  # its templates must render for this host
    abi.check(directory, version, node.config.python, node.paths.real(node.config.python))
    return version


def add(directory: Path, node: Node, *, shown_as: str | None = None,
        report: Report | None = None) -> Added:
    """Store a normalized copy of a release directory as `<state_dir>/releases/<version>/` with its
    digest (`node.release_store`). It is copied into a hidden directory in `releases/` and checked
    there without the writers' lock, so what is checked is what is stored. Then it is renamed into
    place under the lock. The lock is held for the commit alone, never through the copy, signature
    check or ABI probe, so the way back never waits behind an add.

    The same version and digest is `already` stored; another digest is Refused, naming both. A
    symlink, device, FIFO or socket, or a release over the limits, is refused (ReleaseError) by
    path, storing nothing. Messages name it `shown_as` if given (an image's reference, not its mount
    point). `report` is told the copy's progress.
    """
    staging = re.compile(re.escape(str(node.paths.releases_dir)) + r"/\.adding\.[0-9a-f]+(?:/release)?")
    shown = shown_as or str(directory)

    def named(exc: Exception) -> str:  # by where the operator has it, not the staging copy
        return staging.sub(lambda _: shown, str(exc)).replace(str(directory), shown)

    try:
        done = release_store.store(directory, node.paths.releases_dir,
                                   lambda staged: validate(staged, node), node.store.locked,
                                   node.config.store, report, shown,
                                   compile_for(node.paths.real(node.config.python)))
    except BadTree as exc:
        raise ReleaseError(
            f"refusing release {shown}: {named(exc)}; a release holds regular files and "
            "directories only, within the store's limits (docs/operations.md, Releases); "
            "nothing was stored") from None
    except OSError as exc:
        raise ReleaseError(f"could not store release {shown}: {named(exc)}; nothing "
                           "was stored") from None
    except (ReleaseError, AssetError, Refused) as exc:
        raise type(exc)(named(exc)) from None
    return Added(done.version, done.path, done.already, done.digest, done.replaced)
