"""`agent-fsm` on PATH: the config's `bin_link`, a symlink to `<state_dir>/selected/bin/agent-fsm`.

It runs the selected release's launcher; its target never changes. `keep` writes it where
missing or agent-fsm's own with another target. Anything else there is never touched; `doctor`
reports it with the fix.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Literal, NamedTuple

from ... import files
from ..paths import Paths

State = Literal["none", "ok", "missing", "wrong", "foreign"]
# What an agent-fsm link points at, whatever the state_dir: how `keep` knows its own.
_OURS = "/selected/bin/agent-fsm"


class Link(NamedTuple):
    """How the link stands: `none` (not configured), `ok`, `missing`, `wrong` or `foreign`.

    `wrong` is agent-fsm's link to another target; `foreign` is anything else.
    """

    path: Path | None  # where it is written (below --root, if any); None: `bin_link = ""`
    target: str  # the host path it must name
    state: State
    found: str = ""  # what is there instead (`wrong`, `foreign`)

    def detail(self) -> str:
        """How it stands, in words."""
        if self.path is None:
            return 'no link on PATH (`bin_link = ""` in the config)'
        if self.state == "ok":
            return f"{self.path} → {self.target}"
        if self.state == "foreign":
            return f"{self.path} is {self.found}, not agent-fsm's link: left alone"
        if self.state == "wrong":
            return f"{self.path} points at {self.found}, not {self.target}"
        return f"{self.path} is missing"

    def fix(self) -> str:
        """What to do about it (empty when nothing is to be done)."""
        if self.state == "foreign":
            return ("remove it (or set `bin_link` in the config to another path, \"\" for "
                    "none), then run `agent-fsm activate --to V` with the selected V, or restart "
                    "the agent: either writes the link")
        if self.state in ("wrong", "missing"):
            return "the next install, activate or start of the agent writes it"
        return ""

    def words(self) -> str:
        """One line for people: how it stands and what to do."""
        fix = self.fix()
        return self.detail() + (f"; {fix}" if fix else "")


def target(paths: Paths) -> str:
    """The host's path the link names: the selected release's launcher, through `selected`."""
    return str(paths.host_selected / "bin" / "agent-fsm")


def look(paths: Paths) -> Link:
    """How the link stands now; it reads the link, never follows it."""
    want = target(paths)
    if paths.config.bin_link is None:
        return Link(None, want, "none")
    where = paths.real(paths.config.bin_link)
    try:
        st = os.lstat(where)
        found = os.readlink(where) if stat.S_ISLNK(st.st_mode) else ""
    except FileNotFoundError:
        return Link(where, want, "missing")
    except OSError as exc:  # a file where a directory of its path should be, no permission
        return Link(where, want, "foreign", f"unreadable ({exc.strerror or exc})")
    if not stat.S_ISLNK(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a file"
        return Link(where, want, "foreign", kind)
    if found == want:
        return Link(where, want, "ok")
    if found.endswith(_OURS):
        return Link(where, want, "wrong", found)
    return Link(where, want, "foreign", f"a link to {found}")


def keep(paths: Paths) -> Link:
    """Write the link if missing or agent-fsm's own with another target; return how it stands then.

    DiskError on a disk failure; callers log it, since the link is for people only.
    """
    link = look(paths)
    if link.path is None or link.state not in ("missing", "wrong"):
        return link
    files.atomic_symlink(link.path, link.target)
    return link._replace(state="ok", found="")
