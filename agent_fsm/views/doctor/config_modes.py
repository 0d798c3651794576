"""`doctor`'s checks of the files root takes its orders from.

They are the config file (what root runs and renders), the allowed-signers file it names (whose
releases root accepts), and the programs it names by path (checks, hooks, the publish command). Each
must be root's or ours and not writable by group or others. So must every directory above it, up to
--root for a file below it. `modes` checks the state, unit and script directories alike.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ...node.config import DEFAULT_CONFIG, Config, commands
from ...node.paths import Paths
from .finding import Finding
from .modes import loose, lstat, mode_text, ours, q


def config_file(paths: Paths) -> list[Finding]:
    """The config file root reads and the allowed-signers file it names. Each must be root's or
    ours, and neither it nor any directory above it writable by group or others. A missing config's
    directories count too: anyone who may write there may create it."""
    config = paths.config
    files_ = [("config file", config.source or paths.real(DEFAULT_CONFIG), config.source is None)]
    if config.allowed_signers is not None:
        files_.append(("allowed signers", paths.real(config.allowed_signers), False))
    files_ += [("program", paths.real(Path(exe)), False) for exe in programs(config)]
    covered = {d for start in (paths.agent_unit.parent, paths.recovery_script.parent,
                               paths.state_dir.parent) for d in (start, *start.parents)
               if paths.root is None or (d.is_relative_to(paths.root) and d != paths.root)}
    out: list[Finding] = []
    for label, path, may_be_missing in files_:
        st = lstat(path)
        chain = [path]
        if st is not None and stat.S_ISLNK(st.st_mode):  # judged by what it leads to
            chain.append(Path(os.path.realpath(path)))
            try:
                st = os.stat(path)
            except OSError as exc:
                out.append(Finding(label, "fail", f"{path} is a symlink that leads nowhere ({exc})",
                                   f"ln -sfn TARGET {q(path)}  (TARGET: the real file)"))
                continue
        if st is None:
            if label == "program":
                out.append(Finding(label, "fail", f"{path}, which the config has root run (a "
                                   "check, hook or command), does not exist",
                                   "install it, or change the config that names it"))
            elif not may_be_missing:
                out.append(Finding(label, "fail", f"{path} (the config's `allowed_signers`) does "
                                   "not exist: `release add` stores no release until it does",
                                   f"write the trusted signers' keys to {q(path)}"))
        elif not stat.S_ISREG(st.st_mode):
            out.append(Finding(label, "fail", f"{chain[-1]} is not a regular file "
                               f"({stat.filemode(st.st_mode)})", f"rm {q(chain[-1])}"))
        elif not ours(st):
            out.append(Finding(label, "fail", f"{chain[-1]} is owned by uid {st.st_uid}, not root "
                               "or agent-fsm's: that user may change what root runs",
                               f"chown {os.geteuid()} {q(chain[-1])}"))
        elif st.st_mode & 0o022:
            out.append(Finding(label, "fail", f"{chain[-1]} has mode {mode_text(st)}: group or others "
                               "may change what root runs", f"chmod go-w {q(chain[-1])}"))
        for file in chain:
            out += _parents(file, paths.root, covered)
    return out or [Finding("config modes", "ok", "the config file, the allowed signers and the "
                           "programs it names, and the directories above them, are root's or "
                           "ours, and only they may write them")]


def programs(config: Config) -> list[str]:
    """The executables root runs that the config names by absolute path: the judgment's checks, the
    publish command, hooks, and the systemctl and podman prefixes. A bare name is found on root's
    PATH, which is not the config's to change."""
    return sorted({a[0] for a in commands(config) if a and a[0].startswith("/")})


def _parents(file: Path, root: Path | None, covered: set[Path]) -> list[Finding]:
    """The directories above a file root reads, up to --root when the file is below it, less those
    `assets` already checks."""
    out = []
    for d in file.parents:
        if d in covered or (root is not None and file.is_relative_to(root)
                            and (not d.is_relative_to(root) or d == root)):
            continue
        covered.add(d)
        st = lstat(d)
        if st is None or stat.S_ISLNK(st.st_mode):
            continue  # missing: nothing to plant in; a link above: the host's layout
        if not ours(st):
            out.append(Finding("config directory", "fail", f"{d} is owned by uid {st.st_uid}, "
                               "not root or agent-fsm's: that user may swap the file below it",
                               f"chown {os.geteuid()} {q(d)}"))
        elif loose(st, sticky_ok=d != file.parent):
            out.append(Finding("config directory", "fail", f"{d} has mode {mode_text(st)}: writable "
                               "by group or others, who may swap the file below it",
                               f"chmod go-w {q(d)}"))
    return out
