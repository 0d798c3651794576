"""Atomic, durable, link-safe file writes: the one way agent-fsm puts bytes on disk.

A write goes to a temporary file beside the target, is fsynced, renamed over it, and the
directory fsynced: a reader sees the old file or the new, never a torn one. A failed fsync is
not retried, since the kernel may have dropped the dirty pages and a second one would wrongly
succeed; the operation fails and is redone on the next run.

Nothing is written through a symlink: names resolve relative to a directory opened O_NOFOLLOW,
and temporary files are O_EXCL | O_NOFOLLOW. `make_dir` never grants a bit beyond the final
mode. Work in transit is staged in a `private_dir`.

An OSError of a write, fsync, rename, unlink, symlink, chmod or mkdir becomes a DiskError naming
the path, the errno's words and what to do, so an `on_error = "log"` effect tolerates a failing
disk. FileNotFoundError (without `create_dir`) and UnsafePath stay as they are; reads raise
OSError unchanged.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from .errors import DiskError, NeedsRoot, UnsafePath


def _token() -> str:
    """A temporary file's random part; os.urandom, since `secrets` loads OpenSSL (3.6 MB per daemon)."""
    return os.urandom(6).hex()


def unsafe(path: Path, why: str) -> UnsafePath:
    return UnsafePath(f"refusing to write {path}: {why}; nothing was written. Remove or fix it "
                      "and run the command again (`agent-fsm doctor` checks every path)")


_AGAIN = "and run the command again"
_ADVICE = {
    errno.ENOSPC: "free space on the file system of {where} (`df -h {where}`) " + _AGAIN,
    errno.EDQUOT: "free space in uid {uid}'s disk quota on the file system of {where} "
                  "(`quota -u {uid}`) " + _AGAIN,
    errno.EROFS: "remount the file system of {where} read-write (`findmnt -T {where}` names it) "
                 + _AGAIN,
    errno.EIO: "the disk under {where} failed: check it (`dmesg`) and repair or replace it "
               "before you run the command again",
    errno.EACCES: "let uid {uid} write in {where} (`agent-fsm doctor` checks every path) " + _AGAIN,
    errno.EPERM: "let uid {uid} write in {where} (`agent-fsm doctor` checks every path) " + _AGAIN,
}
_OTHERWISE = ("fix what keeps uid {uid} from writing in {where} (`agent-fsm doctor` checks every "
              "path) " + _AGAIN)


def disk_error(exc: OSError, doing: str, where: Path, note: str = "") -> DiskError:
    """The DiskError for `exc`, met while `doing` ("write /var/lib/agent-fsm/x.json") in `where`.

    It says the errno's words, `note` (what was left as it was) and what to do.
    """
    words = exc.strerror or (os.strerror(exc.errno) if exc.errno else str(exc))
    advice = _ADVICE.get(exc.errno or 0, _OTHERWISE).format(where=where, uid=os.geteuid())
    return DiskError(f"could not {doing}: {words}{f' ({note})' if note else ''}; {advice}")


@contextlib.contextmanager
def _disk(doing: str, where: Path, note: str = "", *,
          passing: tuple[type[OSError], ...] = ()) -> Iterator[None]:
    """Turn an OSError in the block into a DiskError, except the `passing` kinds."""
    try:
        yield
    except passing:
        raise
    except OSError as exc:
        raise disk_error(exc, doing, where, note) from exc


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def make_dir(directory: Path, mode: int) -> None:
    """Create the new directory `directory` with exactly `mode`, never more at any moment.

    The bits a umask took are added, and a setgid parent's removed, through a descriptor that
    follows no link. FileExistsError when anything is there, a symlink included.
    """
    os.mkdir(directory, mode)
    fd = os.open(directory, _DIR_FLAGS)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def ensure_dir(directory: Path, mode: int = 0o755) -> None:
    """Create `directory` and its parents if missing; refuse a symlink. DiskError when it fails."""
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        ensure_dir(directory.parent, mode) if directory.parent != directory else None
        with _disk(f"create the directory {directory}", directory.parent), \
                contextlib.suppress(FileExistsError):
            make_dir(directory, mode)
            fsync_dir(directory.parent)  # the new entry survives a power loss
        with _disk(f"create the directory {directory}", directory.parent):
            st = os.lstat(directory)
    except OSError as exc:
        raise disk_error(exc, f"create the directory {directory}", directory.parent) from exc
    if stat.S_ISLNK(st.st_mode):
        raise unsafe(directory, "the directory is a symlink")
    if not stat.S_ISDIR(st.st_mode):
        raise unsafe(directory, "it is not a directory")


@contextlib.contextmanager
def _open_dir(directory: Path, doing: str, *, create: bool = True) -> Iterator[int]:
    if create:
        ensure_dir(directory)
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise unsafe(directory, "the directory is a symlink") from None
        if exc.errno == errno.ENOENT and not create:
            raise  # the caller's to tell apart (`Gate.open`: the agent is not running)
        raise disk_error(exc, doing, directory) from exc
    try:
        yield fd
    finally:
        os.close(fd)


def fsync_dir(directory: Path) -> None:
    """Make the directory's entries (a rename, a new file) durable; DiskError if it fails."""
    with _disk(f"sync the directory {directory}", directory):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def sync_filesystem(directory: Path) -> None:
    """Make every write to the file system holding `directory` durable at once (syncfs(2)).

    For a release's ~1,000 files this takes 0.4 s, against 2-4 s for an fsync of each. Falls
    back to `os.sync()`. DiskError if it fails.
    """
    import ctypes  # here: only `release add` syncs a whole tree

    with _disk(f"sync the file system of {directory}", directory):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            syncfs = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)
            if syncfs is None:
                os.sync()
            elif syncfs(fd) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err))
        finally:
            os.close(fd)


def _refuse_link(dir_fd: int, path: Path) -> None:
    try:
        st = os.lstat(path.name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise unsafe(path, "a symlink is planted there")


def atomic_write(path: Path, data: bytes | Iterable[bytes], mode: int = 0o644, *,
                 create_dir: bool = True) -> None:
    """Replace `path` atomically and durably with `data` (bytes, or chunks) and exactly `mode`.

    On DiskError the old file stays, unless only the final fsync failed. Without `create_dir`, a
    missing directory is FileNotFoundError.
    """
    doing = f"write {path}"
    gone = () if create_dir else (FileNotFoundError,)  # the directory went away: as if missing
    with _open_dir(path.parent, doing, create=create_dir) as dir_fd:
        _refuse_link(dir_fd, path)
        tmp = f".{path.name}.{_token()}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with _disk(doing, path.parent, "the file is as it was", passing=gone):
            try:
                fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
            except FileExistsError:
                raise unsafe(path, f"something is planted at the temporary name {tmp}") from None
            try:
                try:
                    for chunk in (data,) if isinstance(data, bytes) else data:
                        view = memoryview(chunk)
                        while view:
                            view = view[os.write(fd, view):]
                    os.fchmod(fd, mode)  # exact, whatever the umask
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=dir_fd)
                raise
        with _disk(doing, path.parent, "written, but it may not survive a power loss"):
            os.fsync(dir_fd)


def atomic_symlink(link: Path, target: str) -> None:
    """Point `link` at `target` atomically; DiskError, the link unchanged, when the disk fails."""
    doing = f"point {link} at {target}"
    with _open_dir(link.parent, doing) as dir_fd:
        try:
            st = os.lstat(link.name, dir_fd=dir_fd)
            if not stat.S_ISLNK(st.st_mode):
                raise unsafe(link, "a file that is not a pointer symlink is there")
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise disk_error(exc, doing, link.parent) from exc
        tmp = f".{link.name}.{_token()}.tmp"
        with _disk(doing, link.parent, "the link is as it was"):
            os.symlink(target, tmp, dir_fd=dir_fd)
            try:
                os.replace(tmp, link.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=dir_fd)
                raise
        with _disk(doing, link.parent, "switched, but it may not survive a power loss"):
            os.fsync(dir_fd)


def remove(path: Path) -> bool:
    """Remove `path` durably; return whether it existed. DiskError when the disk fails."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise disk_error(exc, f"remove {path}", path.parent) from exc
    fsync_dir(path.parent)
    return True


def read_bytes(path: Path) -> bytes | None:
    """The file's bytes, or None when it does not exist."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of the regular file `path`, following no symlink and never blocking on a FIFO.

    FileNotFoundError when missing; ValueError when it is a symlink, not a regular file, or over
    `limit` bytes.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError("it is a symlink") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("it is not a regular file")
        chunks, size = [], 0  # read in 64 KiB: os.read allocates what it is asked for
        while size <= limit and (chunk := os.read(fd, min(limit + 1 - size, 1 << 16))):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise ValueError(f"it is larger than {limit} bytes")
    return b"".join(chunks)


def trusted_dir(directory: Path) -> Path:
    """The real path of `directory`, once only root and this user can change what its names lead to.

    Every directory from / down must be theirs and not writable by group or others unless sticky
    (as /tmp). UnsafePath names the first that fails.
    """
    real = Path(os.path.realpath(directory))
    for at in (*reversed(real.parents), real):
        st = os.lstat(at)
        if stat.S_ISLNK(st.st_mode):  # one appeared since the path was resolved
            raise UnsafePath(f"{at} became a symlink while it was checked; run the command again")
        if not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(at))
        if st.st_uid not in (0, os.geteuid()):
            raise UnsafePath(f"{at} is owned by uid {st.st_uid}, who could swap what is written "
                             f"below it; use a directory only root and uid {os.geteuid()} own")
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise UnsafePath(f"{at} has mode {stat.S_IMODE(st.st_mode):04o}: group or others "
                             "may rename what is written in it; use a directory they may not "
                             f"write, or make it sticky (`chmod +t {at}`)")
    return real


@contextlib.contextmanager
def private_dir(parent: Path | None = None, prefix: str = "agent-fsm.") -> Iterator[Path]:
    """A new 0700 directory for work in transit, removed with its contents when the block ends.

    It is made exclusively in `parent` (a `trusted_dir`), named `prefix` and 96 random bits, so
    nothing another user planted is used. What was renamed out of it is kept. DiskError when it
    cannot be made or removed.
    """
    if parent is None:
        import tempfile  # here: the daemon never stages

        parent = Path(tempfile.gettempdir())
    with _disk(f"make a staging directory in {parent}", parent):
        path = trusted_dir(parent) / f"{prefix}{os.urandom(12).hex()}"
        make_dir(path, 0o700)
    try:
        yield path
    except BaseException as exc:
        try:
            remove_tree(path)
        except DiskError as failed:
            raise DiskError(f"{failed}; it was left by a command that failed: "
                            f"{exc or type(exc).__name__}") from exc
        raise
    remove_tree(path)


def remove_tree(path: Path) -> None:
    """Remove `path` and all below it, following no link; DiskError names what could not be removed."""
    import shutil  # here: the daemon removes no tree (shutil brings bz2, lzma)

    try:
        shutil.rmtree(path)
    except OSError as exc:
        if not os.path.lexists(path):
            return  # removed meanwhile (a sweep of another command): gone as asked
        at = f" (at {exc.filename})" if exc.filename not in (None, str(path)) else ""
        raise DiskError(f"could not remove {path}: {exc.strerror or exc}{at}; remove it "
                        f"yourself (`rm -rf {path}`; `lsattr` shows an immutable file) and run "
                        "the command again if it failed") from exc


def ensure_private_dir(directory: Path) -> None:
    """Create `directory` 0700 (parents 0755) if missing, or tighten one of ours to 0700.

    A readable lock in it would let any user block every writer. `check_private_dir` refuses it
    if foreign or writable by others.
    """
    ensure_dir(directory.parent)
    ensure_dir(directory, 0o700)
    check_private_dir(directory)
    mode = stat.S_IMODE(os.lstat(directory).st_mode)
    if mode & 0o077:
        with _disk(f"set the mode of {directory} to 0700", directory):
            os.chmod(directory, 0o700, follow_symlinks=False)
        import logging  # here: only tightening a loose directory logs; `status` need not import it

        logging.getLogger("agent_fsm").warning(
            "state directory %s had mode %04o; tightened to 0700: only agent-fsm uses it",
            directory, mode)


def check_private_dir(directory: Path) -> None:
    """Refuse a state directory another user owns or group or others may write."""
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise unsafe(directory, "the state directory is a symlink")
    if st.st_uid == 0 and os.geteuid() != 0:  # an operator without sudo, not a foreign owner
        raise NeedsRoot(f"state directory {directory} is root's")
    if st.st_uid != os.geteuid():
        raise UnsafePath(f"state directory {directory} is owned by uid {st.st_uid}, not by "
                         f"agent-fsm's uid {os.geteuid()}; fix with `chown {os.geteuid()} "
                         f"{directory}`")
    if st.st_mode & 0o022:
        raise UnsafePath(f"state directory {directory} has mode {stat.S_IMODE(st.st_mode):04o}: "
                         f"group or others may write it; fix with `chmod go-w {directory}`")
