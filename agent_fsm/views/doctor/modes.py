"""`doctor`'s directory checks: modes, owners and links of everything root reads or runs.

Root runs `<state_dir>/selected/bin/agent-fsm` and `last-good/bin/agent-fsm` and renders the stored
releases' templates; systemd runs the units and the recovery script. So:

- The state directory is ours and 0700, its lock 0600. Nothing below it is writable by group or
  others, setuid, setgid, another user's, a FIFO, socket, device or symlink. The exceptions are
  the `selected` and `last-good` pointers at releases in `releases/`.
- The three service assets are regular files, root's or ours, not writable by group or others.
- The unit, script and state directories and every directory above them are root's or ours, not
  writable by group or others. A sticky one like /tmp only lets others add their own names.
  Links above them are the host's layout.

Each problem is a `fail` whose fix is the exact command, paths shell-quoted. The walk never follows
a link (O_NOFOLLOW, each directory opened relative to its parent). It stops after MAX_ENTRIES
entries, saying so.
"""

from __future__ import annotations

import errno
import os
import shlex
import stat
from collections.abc import Iterator
from pathlib import Path

from ... import files
from ...errors import AgentFsmError
from ...node.paths import Paths
from .finding import Finding

MAX_ENTRIES = 20_000  # below the state directory
MAX_DEPTH = 64
MAX_REPORTED = 50  # findings about entries below the state directory
POINTERS = ("selected", "last-good")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def q(path: Path) -> str:
    """`path` as one word of a shell command line. A name with control characters or non-UTF-8 bytes
    takes bash's $'…' form, so a planted name cannot add a command."""
    text = str(path)
    if text.isprintable():
        return shlex.quote(text)
    return "$'" + "".join(
        c if c.isprintable() and c not in "\\'" else
        "".join(f"\\x{b:02x}" for b in os.fsencode(c)) for c in text) + "'"


def mode_text(st: os.stat_result) -> str:
    return f"{stat.S_IMODE(st.st_mode):04o}"


def ours(st: os.stat_result) -> bool:
    return st.st_uid in (0, os.geteuid())


def loose(st: os.stat_result, *, sticky_ok: bool = False) -> bool:
    """Group or others may write it (in a sticky directory above ours they may only add names of
    their own, not rename ours)."""
    return bool(st.st_mode & 0o022) and not (sticky_ok and st.st_mode & stat.S_ISVTX)


def lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _target(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def state_dir(paths: Paths) -> list[Finding]:
    """The state directory itself, its lock, and every entry below it."""
    top, uid = paths.state_dir, os.geteuid()
    st = lstat(top)
    if st is None:
        return [Finding("state directory", "ok", f"{top} does not exist yet (the first "
                        "install creates it 0700)")]
    if stat.S_ISLNK(st.st_mode):
        return [Finding("state directory", "fail", f"{top} is a symlink (to {_target(top)!r}); "
                        "agent-fsm refuses it and did not follow it",
                        f"`rm {q(top)}`, after finding out who planted it, then restore the "
                        "state directory from a backup or `agent-fsm install`")]
    out = []
    try:
        files.check_private_dir(top)
    except AgentFsmError as exc:
        owner = st.st_uid != uid
        out.append(Finding("state directory", "fail", str(exc),
                           f"chown {uid} {q(top)}" if owner else f"chmod 0700 {q(top)}"))
    if stat.S_IMODE(st.st_mode) != 0o700 and not st.st_mode & 0o022:
        out.append(Finding("state directory", "fail", f"{top} has mode {mode_text(st)}, not 0700: "
                           "other users may look in and open the lock",
                           f"chmod 0700 {q(top)}"))
    if not out:
        out.append(Finding("state directory", "ok", f"{top} is 0700 and private to uid {uid}"))
    lock = lstat(paths.lock_file)
    if lock is not None and stat.S_ISREG(lock.st_mode) and stat.S_IMODE(lock.st_mode) != 0o600:
        out.append(Finding("lock file", "fail", f"{paths.lock_file} has mode {mode_text(lock)}, not "
                           "0600: another user who opens it can hold it and block every writer",
                           f"chmod 0600 {q(paths.lock_file)}"))
    problems = [f for f in _below(paths) if f is not None]
    if len(problems) > MAX_REPORTED:
        more = len(problems) - MAX_REPORTED
        problems = [*problems[:MAX_REPORTED], Finding(
            "state dir entries", "fail", f"{more} more unsafe entries below {top}",
            "fix the ones above and run `agent-fsm doctor` again")]
    if not problems:
        problems = [Finding("state dir entries", "ok", f"nothing below {top} is writable by "
                            "others, foreign, setuid or a stray link; the pointers point into "
                            "releases/")]
    return out + problems


def _below(paths: Paths) -> Iterator[Finding | None]:
    """One finding per unsafe entry below the state directory (None for a safe one)."""
    uid, count, stopped = os.geteuid(), 0, False
    pointers = {paths.state_dir / name for name in POINTERS}

    def visit(dir_fd: int, directory: Path, depth: int) -> Iterator[Finding | None]:
        nonlocal count, stopped
        try:
            with os.scandir(dir_fd) as it:
                names = []
                for entry in it:
                    names.append(entry.name)
                    if count + len(names) > MAX_ENTRIES:
                        break
        except OSError as exc:
            yield Finding("state dir walk", "warn", f"cannot list {directory}: {exc}")
            return
        for name in sorted(names):
            count += 1
            if stopped:
                return
            if count > MAX_ENTRIES:
                stopped = True
                yield Finding("state dir walk", "warn", f"stopped after {MAX_ENTRIES} entries "
                              f"below {paths.state_dir}; the rest was not checked",
                              "prune old releases (`agent-fsm release prune`)")
                return
            path = directory / name
            try:
                st = os.lstat(name, dir_fd=dir_fd)
            except FileNotFoundError:
                continue  # removed meanwhile
            if path in pointers and stat.S_ISLNK(st.st_mode):
                yield _pointer(paths, path)
                continue
            yield _entry(path, st, uid)
            if stat.S_ISDIR(st.st_mode):
                if depth >= MAX_DEPTH:
                    yield Finding("state dir walk", "warn", f"{path} is nested more than "
                                  f"{MAX_DEPTH} directories deep; not checked below")
                    continue
                try:
                    sub = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
                except OSError as exc:  # ELOOP: swapped for a link meanwhile, never followed
                    if exc.errno != errno.ELOOP:
                        yield Finding("state dir walk", "warn", f"cannot open {path}: {exc}")
                    continue
                try:
                    yield from visit(sub, path, depth + 1)
                finally:
                    os.close(sub)

    try:
        top = os.open(paths.state_dir, _DIR_FLAGS)
    except OSError:
        return  # missing or a link: reported by the state directory's own finding
    try:
        yield from visit(top, paths.state_dir, 1)
    finally:
        os.close(top)


def _entry(path: Path, st: os.stat_result, uid: int) -> Finding | None:
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        return Finding("state dir link", "fail", f"{path} is a symlink (to {_target(path)!r}); "
                       "agent-fsm makes none there but the two pointers, and did not follow it",
                       f"rm {q(path)}")
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        return Finding("state dir entry", "fail", f"{path} is not a regular file or directory "
                       f"(mode {stat.filemode(mode)}); agent-fsm makes none", f"rm {q(path)}")
    if st.st_uid != uid:
        return Finding("state dir owner", "fail", f"{path} is owned by uid {st.st_uid}, not by "
                       f"agent-fsm's uid {uid}: that user may change what root runs",
                       f"chown -h {uid} {q(path)}")
    if mode & 0o022:
        return Finding("state dir mode", "fail", f"{path} has mode {mode_text(st)}: group or "
                       "others may write it", f"chmod go-w {q(path)}")
    if stat.S_ISREG(mode) and mode & 0o6000:
        return Finding("state dir mode", "fail", f"{path} has mode {mode_text(st)}: setuid or "
                       "setgid; agent-fsm stores none", f"chmod ug-s {q(path)}")
    return None


def _pointer(paths: Paths, link: Path) -> Finding | None:
    """`selected` or `last-good` must name a stored release: `releases/<version>`."""
    target = _target(link)
    host_releases = paths.config.state_dir / "releases"
    where = Path(os.path.normpath(paths.config.state_dir / target))  # host view, as systemd's
    version = where.name
    if where.parent != host_releases or version.startswith("."):
        return Finding("pointer", "fail", f"{link} points at {target!r}, outside "
                       f"{host_releases}: root would run what is there",
                       f"ln -sfn releases/VERSION {q(link)}  (VERSION: a stored release, "
                       "`agent-fsm release list`), after finding out who changed it")
    st = lstat(paths.releases_dir / version)
    if st is None or not stat.S_ISDIR(st.st_mode):
        return Finding("pointer", "fail", f"{link} points at {target!r}, which is not a stored "
                       "release directory",
                       f"agent-fsm release add DIR  (DIR: release {version}'s directory)")
    return None


def assets(paths: Paths) -> list[Finding]:
    """The three service assets and the directories above them and the state directory."""
    out = []
    for asset in (paths.agent_unit, paths.recovery_unit, paths.recovery_script):
        st = lstat(asset)
        if st is None:
            continue  # missing: the next start writes it; the assets finding says so
        if stat.S_ISLNK(st.st_mode):
            out.append(Finding("asset", "fail", f"{asset} is a symlink (to {_target(asset)!r}); "
                               "agent-fsm refuses to write through it and did not follow it",
                               f"rm {q(asset)}  (the agent's next start writes it again)"))
        elif not stat.S_ISREG(st.st_mode):
            out.append(Finding("asset", "fail", f"{asset} is not a regular file "
                               f"({stat.filemode(st.st_mode)})", f"rm {q(asset)}"))
        elif not ours(st):
            out.append(Finding("asset", "fail", f"{asset} is owned by uid {st.st_uid}, not root "
                               "or agent-fsm's: that user may change what systemd runs as root",
                               f"chown {os.geteuid()} {q(asset)}"))
        elif st.st_mode & 0o022:
            out.append(Finding("asset", "fail", f"{asset} has mode {mode_text(st)}: group or "
                               "others may change what systemd runs as root",
                               f"chmod go-w {q(asset)}"))
    out += _directories(paths)
    return out or [Finding("asset modes", "ok", "the assets and the directories above them are "
                           "root's or ours, and only they may write them")]


def _directories(paths: Paths) -> list[Finding]:
    named = {paths.agent_unit.parent: "unit directory",
             paths.recovery_script.parent: "script directory"}
    seen: set[Path] = set()
    out = []
    for start in (paths.agent_unit.parent, paths.recovery_script.parent, paths.state_dir.parent):
        for d in (start, *start.parents):
            if d in seen or (paths.root is not None and not d.is_relative_to(paths.root)) \
                    or d == paths.root:
                continue
            seen.add(d)
            st = lstat(d)
            label = named.get(d, "parent directory")
            if st is None:
                continue
            if stat.S_ISLNK(st.st_mode):
                if d in named:  # refused by every write (files.ensure_dir)
                    out.append(Finding(label, "fail", f"{d} is a symlink (to {_target(d)!r})",
                                       f"rm {q(d)} && mkdir -m 0755 {q(d)}  (the agent's next "
                                       "start writes what belongs there)"))
                continue  # above ours: the host's layout (/var/run, a merged /usr)
            elif not ours(st):
                out.append(Finding(label, "fail", f"{d} is owned by uid {st.st_uid}, not root or "
                                   "agent-fsm's: that user may swap what is below it",
                                   f"chown {os.geteuid()} {q(d)}"))
            elif loose(st, sticky_ok=d not in named):
                out.append(Finding(label, "fail", f"{d} has mode {mode_text(st)}: writable by group "
                                   "or others, who may swap what is below it",
                                   f"chmod go-w {q(d)}"))
    return out

