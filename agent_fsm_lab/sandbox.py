"""A private systemd booted in its own namespaces, for end-to-end tests.

`SystemdSandbox` starts the host's own ``/lib/systemd/systemd`` as PID 1 of new PID, mount, UTS,
IPC and cgroup namespaces, and lets a test drive it by running ``systemctl``, ``journalctl`` or
anything else inside (`SystemdSandbox.run`, through ``nsenter``)::

    with SystemdSandbox() as sb:                       # boots in about 0.3 s
        sb.write_unit("demo.service", "[Service]\nExecStart=/bin/sleep infinity\n")
        sb.systemctl("start", "demo.service")
        assert sb.show("demo.service", "ActiveState") == "active", sb.diagnostics("demo.service")

The sandbox shares the host's disk, kernel and network, so before systemd starts it hides or
locks whatever a booting systemd would write, clean or reconfigure on the host:

* tmpfs over ``/run``, ``/tmp``, ``/var/tmp``, ``/etc/systemd/system``, ``/var/lib/systemd`` and
  ``/var/log/journal``: the host's enabled units are invisible, the journal stays in memory, and
  ``/tmp`` inside is another, empty directory;
* empty ``/etc/fstab`` (and crypttab...): no host file system or swap is mounted or checked;
* a private ``/dev`` with a few harmless device nodes, its own ``/dev/pts`` and ``/dev/shm``;
  ``/dev/console`` is a pty whose output is copied to `SystemdSandbox.console_log`;
* ``/sys``, ``/proc/sys`` and ``/proc/sysrq-trigger`` read-only: no sysctl reaches the kernel;
* a cgroup2 hierarchy of its own: a new cgroup below the host's cgroup2 mount, made the root of
  a cgroup namespace, so systemd never touches the host's cgroups (no v1 controller either) and
  every process of the sandbox can be found, and killed, in one place;
* systemd boots `TARGET`, a target of its own with ``DefaultDependencies=no``, and the units in
  `MASKED_UNITS` are masked (a unit with default dependencies pulls in ``sysinit.target``).

Everything else on disk is the host's: units and the files they use belong in
`SystemdSandbox.test_dir`, a real directory with the same path inside and outside, removed at
shutdown.  Units go into the private ``/etc/systemd/system`` (`SystemdSandbox.UNIT_DIR`) through
`SystemdSandbox.write_unit`.  PIDs that systemd reports are PIDs of the sandbox's namespace;
`SystemdSandbox.host_pid` translates one into the host's.  ``systemctl`` works over systemd's
private socket; there is no D-Bus inside, so ``systemd-run`` and ``busctl`` do not.

Booting requires root, util-linux ``unshare``/``nsenter``/``mount``, a cgroup2 mount (pure or
hybrid hierarchy) and ``/lib/systemd/systemd``; `missing_requirements` names what is absent.

``SystemdSandbox(rootfs=TREE)`` boots another distribution's systemd instead (the Debian 13 node
of `agent_fsm_lab.rootfs`: systemd 257, Python 3.13).  The same namespaces, masks and private
mounts are made inside an overlay whose lower layer is TREE (never written: several sandboxes
boot it at once) and whose upper layer lives in `test_dir`; systemd is exec'd chrooted into it,
and `run` enters that root (``nsenter -r -w``).  There nothing of the host's disk is visible but
`test_dir` (read-write) and the `keep` directories (read-only), each at its own path; ``/sys``
is a fresh read-only sysfs, without the host's sysfs submounts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import IO, Final

SYSTEMD: Final = Path("/lib/systemd/systemd")
DEFAULT_BASE_DIR: Final = Path("/var/lib/agent-fsm-e2e")
TARGET: Final = "agent-fsm-e2e.target"

# Units that would change the host if they ran in the sandbox: it shares the host's disk, kernel
# and network.  TARGET pulls in none of them, but any unit with default dependencies (as most
# units under test have) pulls in sysinit.target and basic.target, which want several.
MASKED_UNITS: Final = (
    # would clean the host's /tmp, or write to its /etc, /var or clock
    "systemd-tmpfiles-setup.service",
    "systemd-tmpfiles-setup-dev.service",
    "systemd-tmpfiles-setup-dev-early.service",  # systemd >= 256
    "systemd-tmpfiles-clean.timer",
    "systemd-tmpfiles-clean.service",
    "systemd-sysusers.service",
    "systemd-firstboot.service",
    "systemd-machine-id-commit.service",
    "systemd-remount-fs.service",
    "systemd-update-utmp.service",
    "systemd-update-utmp-runlevel.service",
    "systemd-update-done.service",
    "systemd-hwdb-update.service",
    "systemd-journal-catalog-update.service",
    "systemd-journal-flush.service",
    "systemd-random-seed.service",
    "systemd-pstore.service",
    "systemd-timesyncd.service",
    "ldconfig.service",
    # systemd >= 255: would write EFI variables, the TPM or the boot partition, or merge images
    # over /usr; none of them has anything to do in a test
    "systemd-hibernate-clear.service",
    "systemd-boot-random-seed.service",
    "systemd-tpm2-setup-early.service",
    "systemd-tpm2-setup.service",
    "systemd-pcrmachine.service",
    "systemd-pcrextend.socket",
    "systemd-pcrlock.socket",
    "systemd-sysext.service",
    "systemd-confext.service",
    # would change kernel state, which no namespace here isolates
    "modprobe@.service",
    "systemd-modules-load.service",
    "kmod-static-nodes.service",
    "systemd-sysctl.service",
    "systemd-binfmt.service",
    "proc-sys-fs-binfmt_misc.automount",
    "proc-sys-fs-binfmt_misc.mount",
    "systemd-repart.service",
    "systemd-pcrphase.service",
    "systemd-pcrphase-sysinit.service",
    "systemd-journald-audit.socket",
    # daemons and logins: not wanted in tests (systemctl talks to PID 1 directly, not over D-Bus)
    "dbus.socket",
    "dbus.service",
    "systemd-logind.service",
    "postgresql.service",
    "getty.target",
    "console-getty.service",
)

_TARGET_UNIT: Final = """\
[Unit]
Description=agent-fsm e2e sandbox
DefaultDependencies=no
"""

_JOURNAL_UNITS: Final = ("systemd-journald.socket", "systemd-journald.service")

# Runs as PID 1 of the new namespaces (under `unshare`), prepares the mounts, then becomes systemd.
# $1: the console pty's slave (a host /dev/pts path), $2: staged unit directory,
# $3: systemd's binary, $4: the unit to boot; $5...: host directories under /tmp or /var/tmp to
# keep visible at the same path (the Python running agent-fsm may live there).
_INIT_SCRIPT: Final = r"""
set -eu
console_tty=$1 staged=$2 systemd=$3 unit=$4
shift 4
mount --make-rprivate /
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /run
touch /run/console
mount --bind "$console_tty" /run/console
i=0
for keep in "$@"; do
    mkdir -p "/run/.keep/$i" && mount --rbind "$keep" "/run/.keep/$i"; i=$((i + 1))
done
mount -t proc -o nosuid,nodev,noexec proc /proc
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /tmp
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /var/tmp
i=0
for keep in "$@"; do
    mkdir -p "$keep" && mount --move "/run/.keep/$i" "$keep"; i=$((i + 1))
done
mount -t tmpfs -o mode=0755 tmpfs /etc/systemd/system
cp -a "$staged/." /etc/systemd/system/
for dir in /var/lib/systemd /var/log/journal; do
    if [ -d "$dir" ]; then mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs "$dir"; fi
done
: > /run/empty-table
for table in /etc/fstab /etc/crypttab /etc/integritytab /etc/veritytab; do
    if [ -f "$table" ]; then mount --bind /run/empty-table "$table"; fi
done
mount -t tmpfs -o mode=0755,nosuid tmpfs /dev
mknod -m 666 /dev/null c 1 3
mknod -m 666 /dev/zero c 1 5
mknod -m 666 /dev/full c 1 7
mknod -m 666 /dev/random c 1 8
mknod -m 666 /dev/urandom c 1 9
mknod -m 666 /dev/tty c 5 0
mkdir -m 0755 /dev/pts /dev/shm
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620,nosuid,noexec devpts /dev/pts
ln -s pts/ptmx /dev/ptmx
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm
ln -s /proc/self/fd /dev/fd
ln -s /proc/self/fd/0 /dev/stdin
ln -s /proc/self/fd/1 /dev/stdout
ln -s /proc/self/fd/2 /dev/stderr
touch /dev/console
mount --move /run/console /dev/console
rm /run/console
mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 /sys/fs/cgroup
for path in /proc/sys /proc/sysrq-trigger; do
    if [ -e "$path" ]; then mount --bind "$path" "$path" && mount -o remount,bind,ro "$path"; fi
done
mount -o remount,bind,ro /sys
exec env -i container=other PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 TERM=dumb \
    SYSTEMD_COLORS=0 "$systemd" --system --unit="$unit" --log-target=journal --show-status=no
"""

# The same, for a node booted from a root file system of its own (`rootfs`): every mount is made
# inside the new root, which is an overlay of the (shared, cached, never written) tree with an
# upper layer of this sandbox's own, and systemd is exec'd chrooted into it.
# $1: console pty, $2: staged units, $3: the unit to boot, $4: the tree, $5: the test directory
# (bind-mounted read-write at the same path inside; the overlay's layers live in it), $6...:
# host directories bound read-only at the same path inside.
_ROOTFS_INIT_SCRIPT: Final = r"""
set -eu
console_tty=$1 staged=$2 unit=$3 tree=$4 test_dir=$5
shift 5
root=$test_dir/.node/root
mount --make-rprivate /
mkdir -p "$test_dir/.node/upper" "$test_dir/.node/work" "$root"
mount -t overlay -o "lowerdir=$tree,upperdir=$test_dir/.node/upper,workdir=$test_dir/.node/work" \
    overlay "$root"
mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
for dir in /run /tmp /var/tmp /etc/systemd/system /var/lib/systemd /var/log/journal; do
    mkdir -p "$root$dir"
done
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs "$root/run"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/tmp"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/var/tmp"
mount -t tmpfs -o mode=0755 tmpfs "$root/etc/systemd/system"
cp -a "$staged/." "$root/etc/systemd/system/"
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs "$root/var/lib/systemd"
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs "$root/var/log/journal"
mkdir -p "$root$test_dir"
mount --bind "$test_dir" "$root$test_dir"
for keep in "$@"; do
    mkdir -p "$root$keep"
    mount --rbind "$keep" "$root$keep"
    mount -o remount,bind,ro "$root$keep"
done
mount -t tmpfs -o mode=0755,nosuid tmpfs "$root/dev"
mknod -m 666 "$root/dev/null" c 1 3
mknod -m 666 "$root/dev/zero" c 1 5
mknod -m 666 "$root/dev/full" c 1 7
mknod -m 666 "$root/dev/random" c 1 8
mknod -m 666 "$root/dev/urandom" c 1 9
mknod -m 666 "$root/dev/tty" c 5 0
mkdir -m 0755 "$root/dev/pts" "$root/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620,nosuid,noexec devpts "$root/dev/pts"
ln -s pts/ptmx "$root/dev/ptmx"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/dev/shm"
ln -s /proc/self/fd "$root/dev/fd"
ln -s /proc/self/fd/0 "$root/dev/stdin"
ln -s /proc/self/fd/1 "$root/dev/stdout"
ln -s /proc/self/fd/2 "$root/dev/stderr"
touch "$root/dev/console"
mount --bind "$console_tty" "$root/dev/console"
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$root/sys"
mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$root/sys/fs/cgroup"
for path in "$root/proc/sys" "$root/proc/sysrq-trigger"; do
    if [ -e "$path" ]; then mount --bind "$path" "$path" && mount -o remount,bind,ro "$path"; fi
done
cd "$root"
exec chroot "$root" /usr/bin/env -i container=other PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 TERM=dumb SYSTEMD_COLORS=0 \
    /lib/systemd/systemd --system --unit="$unit" --log-target=journal --show-status=no
"""

# Moves itself into the sandbox's cgroup, then becomes the command ($1: cgroup.procs file).
_JOIN_CGROUP: Final = 'echo $$ > "$1" && shift && exec "$@"'

_BASE_ENV: Final = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "SYSTEMD_PAGER": "",
    "SYSTEMD_COLORS": "0",
    # A pack inside keeps its lib/ cache in the sandbox's private /tmp, not the host's
    # /var/cache/agent-fsm (which a 252 sandbox shares with the host).
    "AGENT_FSM_CACHE_DIR": "/tmp/agent-fsm-lib-cache",
}


class SandboxError(RuntimeError):
    """The sandbox could not be booted or driven."""


def missing_requirements(rootfs: Path | None = None) -> list[str]:
    """What this machine lacks to boot a sandbox (from the root file system `rootfs`, if
    given), one human-readable item each (empty: nothing)."""
    missing: list[str] = []
    if os.geteuid() != 0:
        missing.append(f"root privileges (running as uid {os.geteuid()})")
    for tool in ("unshare", "nsenter", "mount", *(("chroot",) if rootfs else ())):
        if shutil.which(tool, path=_BASE_ENV["PATH"]) is None:
            missing.append(f"the `{tool}` program (util-linux) in {_BASE_ENV['PATH']}")
    systemd = SYSTEMD if rootfs is None else rootfs / SYSTEMD.relative_to("/")
    if not os.access(systemd, os.X_OK):
        missing.append(f"an executable {systemd}")
    if rootfs is not None and not _has_filesystem("overlay"):
        missing.append("the overlay file system (modprobe overlay; see /proc/filesystems)")
    if _cgroup2_mount() is None:
        missing.append("a cgroup2 filesystem mounted on the host (see /proc/self/mountinfo)")
    return missing


def under_private_tmp(path: Path) -> bool:
    resolved = path.resolve()
    return any(resolved == Path(t) or Path(t) in resolved.parents for t in ("/tmp", "/var/tmp"))


def python_paths() -> list[Path]:
    """Where this Python and agent-fsm live: what a sandbox must keep to run agent-fsm inside."""
    import sys

    return [Path(sys.prefix), Path(sys.base_prefix), Path(__file__).resolve().parent.parent]


def _has_filesystem(name: str) -> bool:
    try:
        lines = Path("/proc/filesystems").read_text().splitlines()
    except OSError:
        return False
    return any(line.split()[-1:] == [name] for line in lines)


def _cgroup2_mount() -> Path | None:
    """Where the host's cgroup2 hierarchy is mounted (the first such mount), if anywhere."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        sep = fields.index("-")
        if fields[sep + 1] == "cgroup2" and fields[3] == "/":
            return Path(fields[4].replace("\\040", " "))
    return None


class SystemdSandbox:
    """A private systemd, PID 1 of its own namespaces; see the module docstring.

    Use as a context manager (``with SystemdSandbox() as sb:``) or call `boot` and `shutdown`.
    Commands run inside with `run`; units are written with `write_unit`.
    """

    UNIT_DIR: Final = PurePosixPath("/etc/systemd/system")
    """The unit directory systemd reads, as a path inside the namespace (a private tmpfs)."""

    test_dir: Path
    """Real directory on disk, same path inside and outside; removed at shutdown."""
    console_log: Path
    """What reaches the sandbox's /dev/console, inside `test_dir`: systemd's own log while
    journald is not running (its boot, its last words at shutdown; everything, without the
    journal), output of units with ``StandardOutput=tty``, and errors of the mount setup."""

    def __init__(self, base_dir: Path = DEFAULT_BASE_DIR, keep: Iterable[Path] = (),
                 rootfs: Path | None = None) -> None:
        """Prepare (not boot) a sandbox whose test directory is a new directory in `base_dir`.

        `keep`: host directories to keep visible inside at the same path although they lie under
        the private /tmp or /var/tmp (others are visible anyway and are ignored here).

        `rootfs`: boot that root file system's systemd instead of the host's (a node of another
        distribution, `agent_fsm_lab.rootfs`): the tree is the lower layer of an overlay whose
        upper layer lives in `test_dir`, so the tree itself is never written and several
        sandboxes boot it at once; systemd runs chrooted into the overlay, and `run` enters that
        root too.  Then every directory in `keep` (wherever it lies) is bound read-only at the
        same path inside, and `test_dir` read-write; nothing else of the host's disk is visible.
        """
        self.base_dir = base_dir
        self.rootfs = rootfs
        if rootfs is None:
            self.keep = sorted({str(p) for p in keep if under_private_tmp(Path(p))})
        else:
            self.keep = sorted({str(Path(p).resolve()) for p in keep})
        self.name = f"agent-fsm-e2e-{uuid.uuid4().hex[:12]}"
        self.test_dir = base_dir / self.name
        # The sandbox's own files (its staged units, the node's overlay layers, the console
        # log) stay here, and it is bound inside, even if a caller points `test_dir` at a
        # directory below it (tests sharing one booted sandbox, each in its own).
        self.own_dir = self.test_dir
        self.console_log = self.test_dir / "console.log"
        self._pid: int | None = None
        self._booted = False
        self._unshare: subprocess.Popen[bytes] | None = None
        self._console: IO[bytes] | None = None
        self._cgroup: Path | None = None
        self._pty_master: int | None = None
        self._pty_slave: int | None = None
        self._copier: threading.Thread | None = None

    # Lifecycle -----------------------------------------------------------------------------
    @property
    def pid(self) -> int:
        """systemd's PID as seen from the host (it is PID 1 inside)."""
        if self._pid is None:
            raise SandboxError("the sandbox is not booted")
        return self._pid

    def boot(self, timeout: float = 20.0) -> None:
        """Start systemd, wait until it reports `running` (or `degraded`), start journald.

        On failure everything started so far is torn down before the error propagates.
        """
        if self._unshare is not None:
            raise SandboxError("the sandbox was already booted")
        missing = missing_requirements(self.rootfs)
        if missing:
            raise SandboxError("cannot boot a systemd sandbox; missing: " + "; ".join(missing))
        try:
            self._start()
            self._wait_booted(timeout)
            self.start_journal()
        except BaseException:
            with contextlib.suppress(Exception):  # keep the boot error, not a cleanup one
                self.shutdown()
            raise

    def reboot(self, timeout: float = 20.0) -> None:
        """Power systemd off (every unit stopped, as at a reboot) and boot it again over the same
        disk: `test_dir` stays, and so do the unit files of `UNIT_DIR` (kept across, as a real
        disk keeps /etc/systemd/system); /run, /tmp and the journal start empty. The boot target
        is the sandbox's own, so no enabled unit starts by itself: start what the test needs."""
        if not self._booted:
            raise SandboxError("the sandbox is not booted")
        staged, kept = self.own_dir / ".boot-units", self.own_dir / ".boot-units.kept"
        shutil.rmtree(kept, ignore_errors=True)
        shutil.copytree(self.host_path(self.UNIT_DIR), kept, symlinks=True)  # masks included
        shutil.rmtree(staged)
        kept.rename(staged)
        self._power_off(timeout)
        self._stop_console()
        self.boot(timeout)

    def _power_off(self, timeout: float) -> None:
        """End systemd and every process of the namespace: a clean poweroff when it is booted
        (it may not listen before), then, if it has not exited after `timeout` seconds, kill
        them all (all were started by it); remove its cgroup."""
        proc = self._unshare
        if proc is not None and proc.poll() is None:
            if self._booted:
                with contextlib.suppress(subprocess.SubprocessError, OSError):
                    self.systemctl("poweroff", "--no-block", check=False)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout)
            if proc.poll() is None:
                self._kill_all(proc)
                proc.wait(timeout)
        self._unshare, self._pid, self._booted = None, None, False
        if self._cgroup is not None:
            self._remove_cgroup(self._cgroup, timeout)
            self._cgroup = None

    def _start(self) -> None:
        staged = self.own_dir / ".boot-units"
        if not staged.is_dir():  # else a reboot: the staged units are those kept across it
            self.own_dir.mkdir(parents=True, mode=0o755)
            staged.mkdir()
            (staged / TARGET).write_text(_TARGET_UNIT)
            for unit in MASKED_UNITS:
                (staged / unit).symlink_to("/dev/null")
        self.console_log.touch()

        mount = _cgroup2_mount()
        assert mount is not None  # checked by missing_requirements()
        self._cgroup = mount / self.name
        self._cgroup.mkdir()

        self._console = self.console_log.open("ab")
        self._start_console()
        assert self._pty_slave is not None
        if self.rootfs is None:
            init = [_INIT_SCRIPT, "sh", os.ttyname(self._pty_slave), str(staged), str(SYSTEMD),
                    TARGET, *self.keep]
        else:
            init = [_ROOTFS_INIT_SCRIPT, "sh", os.ttyname(self._pty_slave), str(staged), TARGET,
                    str(self.rootfs.resolve()), str(self.own_dir.resolve()), *self.keep]
        argv = [
            "sh", "-c", _JOIN_CGROUP, "sh", str(self._cgroup / "cgroup.procs"),
            "unshare", "--pid", "--fork", "--kill-child", "--mount", "--uts", "--ipc", "--cgroup",
            "--propagation", "private",
            "sh", "-c", *init,
        ]  # fmt: skip
        self._unshare = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._console,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(_BASE_ENV),
        )

    def _start_console(self) -> None:
        """Open the pty that becomes /dev/console inside; a thread copies it to console.log.

        systemd only logs to a terminal, hence a pty rather than the file itself.  We hold the
        slave side open until shutdown so that the copier sees end-of-file only then.
        """
        master, slave = os.openpty()
        self._pty_master, self._pty_slave = master, slave
        console = self._console
        assert console is not None

        def copy() -> None:
            while True:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every slave fd is closed
                    return
                if not data:
                    return
                try:
                    console.write(data.replace(b"\r", b""))  # systemd writes \r\n, and ONLCR
                    console.flush()
                except (OSError, ValueError):  # closed by shutdown
                    return

        self._copier = threading.Thread(target=copy, name=f"{self.name}-console", daemon=True)
        self._copier.start()

    def _wait_booted(self, timeout: float) -> None:
        assert self._unshare is not None
        deadline = time.monotonic() + timeout
        children = Path(f"/proc/{self._unshare.pid}/task/{self._unshare.pid}/children")
        while self._pid is None:
            if self._unshare.poll() is not None:
                raise SandboxError(
                    f"the namespace exited ({self._unshare.returncode}) before systemd started"
                    + self._console_tail()
                )
            with contextlib.suppress(OSError):
                pids = children.read_text().split()
                if pids:
                    self._pid = int(pids[0])
                    break
            if time.monotonic() > deadline:
                raise SandboxError("systemd's process did not appear" + self._console_tail())
            time.sleep(0.01)
        state = ""
        while True:
            if self._unshare.poll() is not None:
                why = f"systemd exited ({self._unshare.returncode}) while booting"
                raise SandboxError(why + self._console_tail())
            proc = self.systemctl("is-system-running", check=False)
            state = proc.stdout.strip()
            if state in ("running", "degraded"):
                self._booted = True
                return
            if time.monotonic() > deadline:
                raise SandboxError(
                    f"systemd did not finish booting in {timeout}s (last state: {state!r}, "
                    f"stderr: {proc.stderr.strip()!r})" + self._console_tail()
                )
            time.sleep(0.02)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Power systemd off, wait for the namespace to end, and remove `test_dir`.

        If systemd has not exited after `timeout` seconds (or never finished booting), every
        process of the sandbox is killed instead: all of them were started by it.  Safe to call
        more than once, and on a sandbox whose boot failed or never happened.
        """
        try:
            self._power_off(timeout)
        finally:
            self._stop_console()
            shutil.rmtree(self.own_dir, ignore_errors=True)
            with contextlib.suppress(OSError):
                self.base_dir.rmdir()  # only once no other sandbox uses it

    def _stop_console(self) -> None:
        if self._pty_slave is not None:
            os.close(self._pty_slave)
            self._pty_slave = None
        if self._copier is not None:
            self._copier.join(2.0)  # ends at EIO, once no process holds the console open
            if self._copier.is_alive():
                self._pty_master = None  # still read by the thread: leave it open
            self._copier = None
        if self._pty_master is not None:
            os.close(self._pty_master)
            self._pty_master = None
        if self._console is not None:
            self._console.close()
            self._console = None

    def _kill_all(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL every process of the sandbox: all of them were started by it.

        That is everything in its cgroup, plus our child `proc` in case it has not yet moved
        into the cgroup.  `proc` runs ``unshare --kill-child``: its death kills systemd, and
        systemd's death ends every process of its PID namespace.
        """
        if self._cgroup is not None:
            with contextlib.suppress(OSError):  # no cgroup.kill before Linux 5.14
                (self._cgroup / "cgroup.kill").write_text("1")
        proc.kill()

    def _remove_cgroup(self, cgroup: Path, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                for path in sorted(cgroup.glob("**/"), key=lambda p: len(p.parts), reverse=True):
                    with contextlib.suppress(FileNotFoundError):
                        path.rmdir()
                return
            except OSError:  # EBUSY: a process (ours: the cgroup is ours) is still in it
                if time.monotonic() > deadline:
                    raise
                with contextlib.suppress(OSError):
                    (cgroup / "cgroup.kill").write_text("1")
                time.sleep(0.05)

    def __enter__(self) -> SystemdSandbox:
        self.boot()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()

    # Driving it ----------------------------------------------------------------------------
    def run(
        self,
        *argv: str,
        check: bool = True,
        timeout: float = 60,
        env: dict[str, str] | None = None,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` inside the namespaces, as root, in ``/``; text output is captured.

        The environment is a small fixed one (PATH, LANG, no pager, no colours, a private
        cache for packs) updated with `env`; nothing is inherited from the test process.  With
        `check`, a non-zero exit raises `subprocess.CalledProcessError` whose message includes
        the command's output.  After
        `timeout` seconds `subprocess.TimeoutExpired` is raised; the command itself may then
        live on inside until `shutdown`, which ends every process of the sandbox.
        """
        if not argv:
            raise ValueError("run() needs a command")
        # -r -w: systemd's root and working directory, i.e. the node's own tree (`rootfs`).
        root = ["-r", "-w"] if self.rootfs is not None else []
        nsenter = ["nsenter", "-t", str(self.pid), "-m", "-p", "-u", "-i", "-C", *root, "--",
                   *argv]
        assert self._cgroup is not None
        full = ["sh", "-c", _JOIN_CGROUP, "sh", str(self._cgroup / "cgroup.procs"), *nsenter]
        proc = subprocess.run(
            full,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**_BASE_ENV, **(env or {})},
            check=False,
        )
        result = subprocess.CompletedProcess(list(argv), proc.returncode, proc.stdout, proc.stderr)
        if check and result.returncode != 0:
            raise _CommandFailed(result)
        return result

    def popen(self, *argv: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """Start `argv` inside the namespaces, as `run` does, without waiting for it: its output
        is piped, it is in a session of its own, and `shutdown` ends it if the caller does not.
        The process returned is nsenter's; the command is its child (nsenter forks it into the
        sandbox's PID namespace, and stops itself when the command is stopped)."""
        if not argv:
            raise ValueError("popen() needs a command")
        assert self._cgroup is not None
        return subprocess.Popen(
            ["sh", "-c", _JOIN_CGROUP, "sh", str(self._cgroup / "cgroup.procs"),
             "nsenter", "-t", str(self.pid), "-m", "-p", "-u", "-i", "-C", "--", *argv],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True, env={**_BASE_ENV, **(env or {})})

    def systemctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`run` ``systemctl --no-pager ARGS`` inside."""
        return self.run("systemctl", "--no-pager", *args, check=check)

    def host_path(self, inside: str | PurePosixPath) -> Path:
        """The host's path to the absolute path `inside`, as the sandbox sees it.

        It goes through ``/proc/PID/root``, so it reaches the sandbox's private mounts (its
        ``/tmp``, ``/run``, ``UNIT_DIR``) while it runs.  Absolute symlinks met on the way
        resolve against the host's root, not the sandbox's.
        """
        path = PurePosixPath(inside)
        if not path.is_absolute():
            raise ValueError(f"not an absolute path: {inside!r}")
        return Path(f"/proc/{self.pid}/root") / path.relative_to("/")

    def write_unit(self, name: str, text: str, reload: bool = True) -> None:
        """Write unit file `name` into `UNIT_DIR` (inside), then ``daemon-reload`` if `reload`."""
        if "/" in name or name.startswith("."):
            raise ValueError(f"not a unit file name: {name!r}")
        self.host_path(self.UNIT_DIR / name).write_text(text)
        if reload:
            self.systemctl("daemon-reload")

    def show(self, unit: str, prop: str) -> str:
        """One property of `unit`, as ``systemctl show -p PROP --value`` prints it."""
        return self.systemctl("show", "-p", prop, "--value", unit).stdout.strip()

    def host_pid(self, ns_pid: int) -> int:
        """The host's PID of the process that is `ns_pid` inside the sandbox."""
        ns = os.stat(f"/proc/{self.pid}/ns/pid")
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                other = os.stat(entry / "ns" / "pid")
                if (other.st_dev, other.st_ino) != (ns.st_dev, ns.st_ino):
                    continue
                status = (entry / "status").read_text()
            except OSError:
                continue  # gone, or a kernel thread
            for line in status.splitlines():
                if line.startswith("NSpid:") and int(line.split()[-1]) == ns_pid:
                    return int(entry.name)
        raise LookupError(f"no process is PID {ns_pid} in the sandbox")

    # Waiting and diagnostics ---------------------------------------------------------------
    def wait_for(
        self,
        predicate: Callable[[], bool],
        timeout: float,
        what: str,
        units: Iterable[str] = (),
    ) -> None:
        """Poll `predicate` every 50 ms until it is true.

        After `timeout` seconds, raise AssertionError naming `what`, with `diagnostics` for
        `units` (systemctl status and journal of each) and the tail of systemd's console log.
        """
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout}s waiting for {what}\n" + self.diagnostics(*units)
                )
            time.sleep(0.05)

    def start_journal(self) -> None:
        """Start journald inside (idempotent; `boot` does it).

        From then on units' output and systemd's own messages go to the journal, not the console.
        Any unit with default dependencies would start it too, through ``sysinit.target``.
        """
        self.systemctl("start", *_JOURNAL_UNITS)

    def journal(self, unit: str | None = None, lines: int | None = None) -> str:
        """The sandbox's journal (of `unit` only, if given; its last `lines`, if given)."""
        journald = self.systemctl("is-active", "--quiet", "systemd-journald.service", check=False)
        if journald.returncode != 0:
            return "(journald is not running in the sandbox; call start_journal())"
        self.run("journalctl", "--sync", check=False)
        argv = ["journalctl", "--no-pager", "--no-hostname", "-o", "short-monotonic"]
        if unit is not None:
            argv += ["-u", unit]
        if lines is not None:
            argv += ["-n", str(lines)]
        proc = self.run(*argv, check=False)
        return proc.stdout + proc.stderr

    def diagnostics(self, *units: str, lines: int = 40) -> str:
        """Status and journal of each of `units`, failed units, and the console log's tail."""
        parts: list[str] = []
        try:
            for unit in units:
                status = self.systemctl("status", "--lines=0", "--full", unit, check=False)
                parts.append(f"--- systemctl status {unit}\n{status.stdout}{status.stderr}")
                parts.append(f"--- journal of {unit}\n{self.journal(unit, lines)}")
            failed = self.systemctl("list-units", "--failed", "--all", "--plain", check=False)
            parts.append(f"--- failed units\n{failed.stdout}")
        except (OSError, SandboxError, subprocess.SubprocessError) as exc:
            parts.append(f"--- (could not query the sandbox: {exc})")
        return "\n".join(parts) + self._console_tail(lines)

    def _console_tail(self, lines: int = 40) -> str:
        try:
            text = self.console_log.read_text(errors="replace").splitlines()[-lines:]
        except OSError as exc:
            return f"\n--- console log unreadable: {exc}"
        return f"\n--- last {len(text)} lines of {self.console_log}\n" + "\n".join(text)


class _CommandFailed(subprocess.CalledProcessError):
    """CalledProcessError whose message carries the command's output."""

    def __init__(self, proc: subprocess.CompletedProcess[str]) -> None:
        super().__init__(proc.returncode, proc.args, proc.stdout, proc.stderr)

    def __str__(self) -> str:
        return f"{super().__str__()}\n--- stdout\n{self.stdout}--- stderr\n{self.stderr}"
