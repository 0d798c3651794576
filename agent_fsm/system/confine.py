"""The workload's own view of the file system: agent-fsm's directories read-only, for any user, root included.

The workload starts in its own mount namespace (`unshare(CLONE_NEWNS)` between fork and exec),
its mounts slaves, so nothing reaches the host. Each agent-fsm directory is bound onto itself,
and everything below remounted read-only, keeping its other flags. The working directory is
entered after.

Root could undo read-only mounts, so the capabilities that could (CAP_SYS_ADMIN, CAP_SYS_PTRACE,
CAP_DAC_READ_SEARCH, CAP_SYS_MODULE, CAP_SYS_RAWIO, CAP_PERFMON, CAP_BPF) leave the bounding,
inheritable and ambient sets. The account is switched last. A refused step fails the start with
`Refused`.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable, Sequence

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_SLAVE, MS_RELATIME = 1 << 14, 1 << 19, 1 << 21
# statvfs(3)'s f_flag bits and the mount flags they stand for, kept on a read-only remount.
KEPT_FLAGS = ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
              (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME),
              (os.ST_RELATIME, MS_RELATIME))
PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
CAP_DAC_READ_SEARCH, CAP_SYS_MODULE, CAP_SYS_RAWIO, CAP_SYS_PTRACE = 2, 16, 17, 19
CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF = 21, 38, 39
DROPPED = (CAP_DAC_READ_SEARCH, CAP_SYS_MODULE, CAP_SYS_RAWIO, CAP_SYS_PTRACE, CAP_SYS_ADMIN,
           CAP_PERFMON, CAP_BPF)
CAPABILITY_VERSION_3 = 0x20080522
MOUNTINFO = "/proc/self/mountinfo"


class Refused(Exception):
    """A step of the confinement failed: `step` names it, `errno` is the kernel's answer."""

    def __init__(self, step: str, code: int) -> None:
        super().__init__(f"{step}: {os.strerror(code)}")
        self.step = step
        self.errno = code


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _libc() -> ctypes.CDLL:
    # The symbols this process has loaded, libc's among them (`ctypes.util` would bring
    # shutil and tempfile into the daemon to find its file).
    return ctypes.CDLL(None, use_errno=True)


def _unescape(field: str) -> str:
    """A mount point as mountinfo writes it: space, tab, newline and backslash as octal."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounts_below(path: str, mountinfo: str) -> list[str]:
    """The mount points at or below `path` in a mountinfo text, outermost first."""
    found = []
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if len(fields) > 4:
            point = _unescape(fields[4])
            if point == path or point.startswith(path.rstrip("/") + "/"):
                found.append(point)
    return sorted(dict.fromkeys(found), key=len)


def outermost(paths: Sequence[str]) -> list[str]:
    """`paths` without those inside another one (a recursive bind of that one covers them)."""
    kept: list[str] = []
    for p in sorted(dict.fromkeys(paths), key=len):
        if not any(p == k or p.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(p)
    return kept


def preparer(read_only: Sequence[str], cwd: str, uid: int | None, gid: int | None,
             groups: Sequence[int] | None, report: int) -> Callable[[], None]:
    """What the child runs between fork and exec (`Popen(preexec_fn=...)`).

    It makes `read_only` read-only in a new namespace and drops the capabilities, enters `cwd`
    and switches the account. A failure writes "step\\0errno" to `report` and raises. Everything
    it calls is resolved before the fork.
    """
    libc = _libc()
    mount, unshare, prctl = libc.mount, libc.unshare, libc.prctl
    mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                      ctypes.c_void_p]
    capget, capset = libc.capget, libc.capset
    roots = [os.fsencode(p) for p in outermost(read_only)]
    where = [os.fsdecode(p) for p in roots]
    place = os.fsencode(cwd)

    def fail(step: str, code: int) -> None:
        os.write(report, f"{step}\0{code}".encode(errors="replace"))
        raise Refused(step, code)

    def call(step: str, result: int) -> None:
        if result != 0:
            fail(step, ctypes.get_errno() or errno.EPERM)

    def prepare() -> None:
        if roots:
            view()
        try:
            os.chdir(place)
            if groups is not None:
                os.setgroups(list(groups))
            if gid is not None:
                os.setgid(gid)
            if uid is not None:
                os.setuid(uid)
        except OSError as exc:
            fail("enter its directory and switch its account", exc.errno or errno.EPERM)

    def view() -> None:
        call("unshare(CLONE_NEWNS)", unshare(CLONE_NEWNS))
        call("mount --make-rslave /", mount(None, b"/", None, MS_REC | MS_SLAVE, None))
        for raw, path in zip(roots, where, strict=True):
            if not os.path.isdir(path):
                continue
            call(f"mount --rbind {path} {path}", mount(raw, raw, None, MS_BIND | MS_REC, None))
        try:
            with open(MOUNTINFO, encoding="utf-8", errors="surrogateescape") as f:
                table = f.read()
        except OSError as exc:
            fail(f"read {MOUNTINFO}", exc.errno or errno.EIO)
        for path in where:
            if not os.path.isdir(path):
                continue
            for point in mounts_below(path, table):
                try:
                    have = os.statvfs(point).f_flag
                except OSError:
                    continue  # a mount point hidden by another mount above it
                flags = MS_REMOUNT | MS_BIND | MS_RDONLY
                flags |= sum(ms for st, ms in KEPT_FLAGS if have & st)
                call(f"mount -o remount,bind,ro {point}",
                     mount(None, os.fsencode(point), None, flags, None))
        for cap in DROPPED:
            if prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 \
                    and ctypes.get_errno() != errno.EINVAL:  # EINVAL: a kernel without it
                fail(f"drop capability {cap} from the bounding set", ctypes.get_errno())
        header, data = _CapHeader(CAPABILITY_VERSION_3, 0), (_CapData * 2)()
        call("capget", capget(ctypes.byref(header), data))
        for cap in DROPPED:
            data[cap // 32].inheritable &= ~(1 << (cap % 32)) & 0xFFFFFFFF
        call("capset", capset(ctypes.byref(header), data))
        if prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 \
                and ctypes.get_errno() != errno.EINVAL:  # EINVAL: no ambient set (< 4.3)
            fail("clear the ambient capabilities", ctypes.get_errno())

    return prepare


def refused(report: int) -> Refused | None:
    """The step the child reported on `report` before its exec failed, if it reported one."""
    try:
        raw = os.read(report, 4096)
    except OSError:
        return None
    step, _, code = raw.decode(errors="replace").partition("\0")
    return Refused(step, int(code)) if code.isdigit() else None
