"""Starting the release's workload: its account, its environment, its journal stream.

- Account: `[workload] user`/`group`, by name or number, with the user's groups (initgroups(3)).
  No user: the daemon's. A missing one is a WorkloadError.
- Environment: built from nothing, never the daemon's (no `NOTIFY_SOCKET`).
- Journal: stdout (and stderr, unless forwarded) is a stream to journald opened with the stream
  protocol's header, so lines carry `SYSLOG_IDENTIFIER=<identifier>`. Without journald the
  workload inherits the daemon's output.
"""

from __future__ import annotations

import grp
import os
import pwd
import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from ..errors import WorkloadError
from . import confine

JOURNAL_STDOUT = Path("/run/systemd/journal/stdout")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PRIORITY_INFO = 6


class Account(NamedTuple):
    """Who the workload runs as: ids for the kernel, a name and a home for its environment.

    `change` is False for the daemon's own account (nothing to switch).
    """

    uid: int
    gid: int
    groups: tuple[int, ...]
    name: str
    home: str
    change: bool

    def words(self) -> str:
        return f"{self.name} (uid {self.uid}, gid {self.gid})"


def _group_id(group: str | int, where: str) -> int:
    if isinstance(group, int):
        return group
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise WorkloadError(f"{where} group {group!r} does not exist on this host; create it or "
                            "change `[workload] group`") from None


def account(user: str | int | None, group: str | int | None, where: str) -> Account:
    """The account `[workload]` names (`where`: the config file, for the message)."""
    if user is None and group is None:
        uid = os.geteuid()
        try:
            own = pwd.getpwuid(uid)
            return Account(uid, os.getegid(), (), own.pw_name, own.pw_dir or "/", False)
        except KeyError:
            return Account(uid, os.getegid(), (), str(uid), "/", False)
    entry: pwd.struct_passwd | None = None
    named = "root" if user is None else user
    try:
        entry = pwd.getpwuid(named) if isinstance(named, int) else pwd.getpwnam(named)
    except KeyError:
        if not isinstance(named, int):
            raise WorkloadError(f"{where}: [workload] user {named!r} does not exist on this "
                                "host; create it (useradd --system) or change `[workload] user`"
                                ) from None
    uid = entry.pw_uid if entry is not None else int(named)
    if group is not None:
        gid = _group_id(group, f"{where}: [workload]")
    elif entry is not None:
        gid = entry.pw_gid
    else:
        raise WorkloadError(f"{where}: [workload] user {user} has no entry on this host, so it "
                            "has no primary group: set `[workload] group`")
    name = entry.pw_name if entry is not None else str(uid)
    groups = tuple(sorted(set(os.getgrouplist(name, gid)))) if entry is not None else (gid,)
    return Account(uid, gid, groups, name, (entry.pw_dir if entry else "") or "/", True)


def environment(who: Account, release: Mapping[str, str],
                host: Sequence[tuple[str, str]]) -> dict[str, str]:
    """The workload's whole environment: the documented base, the release's `AGENT_FSM_*`, then
    the host's `[workload] environment`."""
    env = {"PATH": PATH, "LANG": "C.UTF-8", "HOME": who.home, "USER": who.name,
           "LOGNAME": who.name, **release}
    env.update(host)
    return env


def journal_stream(identifier: str, socket_path: Path = JOURNAL_STDOUT) -> socket.socket | None:
    """A stream to journald whose lines carry `identifier`; None when its socket is missing or refuses.

    The caller then says so and lets the workload inherit its output.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.connect(str(socket_path))
        # identifier, unit id (empty: journald takes the unit from the cgroup), priority,
        # level prefix ("<N>" lines set their priority), forward to syslog, kmsg, console.
        sock.sendall(f"{identifier}\n\n{PRIORITY_INFO}\n1\n0\n0\n0\n".encode())
        sock.shutdown(socket.SHUT_RD)
    except OSError:
        sock.close()
        return None
    return sock


def start(argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], who: Account,
          output: socket.socket | None, errors: int | None = None, read_only: Sequence[Path] = (),
          unconfined: Callable[[str], None] = lambda _why: None) -> subprocess.Popen[bytes]:
    """Start the workload as `who`, in `cwd`, with exactly `env`; WorkloadError if it cannot start.

    `read_only` is read-only in its own namespace (`confine`). Where the kernel refuses that,
    root or the daemon's account is not started; another account starts unconfined, told why, as
    file permissions keep it out.
    """
    if read_only:
        try:
            return _start(argv, cwd, env, who, (output, errors), read_only)
        except confine.Refused as exc:
            if who.uid in (0, os.geteuid()):
                raise WorkloadError(
                    f"the workload {argv[0]!r} was not started: as {who.words()} it could write "
                    f"agent-fsm's state dir and stored releases, and the kernel refused its "
                    f"read-only view of them ({exc}); let the agent unit keep CAP_SYS_ADMIN (no "
                    "CapabilityBoundingSet= without it) or set `[workload] user` to another "
                    "account") from None
            unconfined(f"the kernel refused the workload's read-only view of agent-fsm's "
                       f"directories ({exc}); starting it without one, as {who.words()}: file "
                       "permissions keep that account out of the state dir and the store")
    return _start(argv, cwd, env, who, (output, errors), ())


def _start(argv: Sequence[str], cwd: Path, env: Mapping[str, str], who: Account,
           streams: tuple[socket.socket | None, int | None],
           read_only: Sequence[Path]) -> subprocess.Popen[bytes]:
    out = streams[0].fileno() if streams[0] is not None else None
    err = out if streams[1] is None else streams[1]
    switch = who.change
    report, tell = os.pipe()  # both close at exec: the child writes a refused step into `tell`
    try:
        prepare = confine.preparer([str(p) for p in read_only], str(cwd),
                                   who.uid if switch else None, who.gid if switch else None,
                                   list(who.groups) if switch else None, tell)
        try:
            # The child enters `cwd` and switches the account itself, after its namespace is
            # made: a directory entered before would stay on the writable mount.
            return subprocess.Popen(
                list(argv), env=dict(env), stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                preexec_fn=prepare)
        except (OSError, subprocess.SubprocessError) as exc:
            os.close(tell)
            tell = -1
            refused = confine.refused(report)
            why: Exception = exc
            if refused is not None and refused.step.startswith("enter its directory"):
                why = OSError(refused.errno, f"{os.strerror(refused.errno)}: {str(cwd)!r}")
            elif refused is not None and read_only:
                raise refused from None
            raise WorkloadError(f"the workload {argv[0]!r} could not start as {who.words()} in "
                                f"{cwd}: {why}") from None
    finally:
        os.close(report)
        if tell >= 0:
            os.close(tell)
