"""The errors agent-fsm raises, all under one root.

    AgentFsmError                  exit 1: something is wrong; the message says what and what to do
    ├── ConfigError                the config file is missing, unparsable or has a bad key/value
    ├── DefinitionError            states/agent-upgrade.toml is inconsistent (names the states)
    ├── Invalid                    a field of a file agent-fsm reads back is not valid (names the
    │                              field and its value; a ValueError too: readers name the file)
    ├── StateFileError             state.json is damaged, newer or unknown; it is left untouched
    │   └── DocumentError          a file of the state dir is refused (node.state.document_file)
    ├── SignalError                the upgrade signal file is unreadable
    ├── KnownBadDamaged            known-bad.json is damaged; it is left untouched
    ├── ReleaseError               a release is missing or its manifest is invalid
    │   ├── BadTree                a release tree holds what the store refuses (a symlink, a
    │   │                          device, a loose mode) or is over its limits (callers re-word it)
    │   └── BadArchive             a release archive is not tar, damaged, or over the reader's
    │                              bounds (one clause; callers name the archive)
    ├── AssetError                 a service asset could not be rendered, restored or kept
    ├── UnsafePath                 a path to write is a symlink, or a directory others may write
    │   └── NeedsRoot              the state dir is root's and this process is not (the CLI says
    │                              "needs root: run it as root", as for a permission error)
    ├── DiskError                  a write, fsync, rename, unlink, symlink, chmod or mkdir failed
    │                              (full, read-only, I/O error): names the path and what to do
    ├── LockTimeout                a lock was held by another process too long (callers re-word it)
    ├── CouldNotRun                a command did not start or timed out (callers re-word it)
    ├── InterpreterUnreadable      a Python asked its ABI ran but did not say (callers re-word it)
    ├── BadSignature               ssh-keygen did not verify or make a signature (callers re-word it)
    ├── ChannelError               a channel's root, index or release is refused (unsigned,
    │   │                          replayed, expired, malformed, oversized)
    │   └── Unreachable            its server could not be reached, answered otherwise than
    │                              with the file, or too slowly (tried again at the next follow)
    ├── SystemdError               a systemctl call failed
    ├── PublishError               publishing an upgrade's result failed (retried by the daemon)
    ├── WorkloadError              the release's workload cannot start (its user does not exist,
    │                              its command cannot run)
    ├── Refused                    exit 3: the operation may not run now (gate closed, upgrade
    │   │                          pending, or the trigger is not allowed in this state)
    │   ├── IllegalTransition      a trigger fired from a state that has no such transition
    │   └── NotItsRole             a process may not fire (or finish) a transition of another
    │                              role: the candidate's code never runs the way back
    └── RolledBack                 exit 4: `upgrade --wait` saw the candidate judged failed

The CLI turns each into one line on stderr and its exit code; no traceback reaches a user.

Not an error, and so not under the root: `StopRequested`, a stop (SIGTERM) heard while waiting
for the writers' lock; it unwinds the daemon past every handler of failures to a clean exit.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_ROLLED_BACK = 4


class AgentFsmError(Exception):
    """The root of every error agent-fsm raises on purpose."""

    exit_code = EXIT_ERROR


class ConfigError(AgentFsmError):
    """The configuration cannot be used."""


class DefinitionError(AgentFsmError):
    """The machine's definition is inconsistent."""


class Invalid(AgentFsmError, ValueError):
    """One field of a file agent-fsm reads back is not what it must be; the message names it and
    its value (`node.state.validate` words it). A ValueError too: each reader catches it with its
    parser's ValueErrors and re-words both, naming the file."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


class StateFileError(AgentFsmError):
    """The state file cannot be trusted; it is never overwritten."""


class DocumentError(StateFileError):
    """A file of the state dir is damaged, newer or not valid; it is left untouched. `detail`
    is what the message says after the file's name (its readers word their own lines too)."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail
        self.why = detail.removeprefix(":").strip()


class SignalError(AgentFsmError):
    """The upgrade signal cannot be read."""


class KnownBadDamaged(AgentFsmError):
    """The known-bad record cannot be read or validated; it is left as it is."""


class ReleaseError(AgentFsmError):
    """A release is missing or malformed."""


class BadTree(ReleaseError):
    """An entry the release store does not accept, or a tree over the limits: `path`, then why."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path} {why}")


class NoRoom(ReleaseError):
    """A release does not fit the store's disk: what it needs, what is free, what is kept."""


class BadArchive(ReleaseError):
    """A tar archive refused while it is read: why, as a clause ("it is not a tar archive")."""


class AssetError(AgentFsmError):
    """A service asset could not be rendered, restored or kept (writing one that fails is a
    DiskError)."""


class UnsafePath(AgentFsmError):
    """A path agent-fsm writes is a symlink, or a directory others may write to."""


class NeedsRoot(UnsafePath):
    """What this process must use is root's, and it does not run as root."""


class DiskError(AgentFsmError):
    """A write, fsync, rename, unlink, symlink, chmod or mkdir of `files` failed: one line naming
    the path, the errno's words and what to do, raised from the OSError."""


class LockTimeout(AgentFsmError):
    """A lock was held by another process for longer than the caller would wait; the message is
    the lock's path (the store re-words it as Refused)."""


class StopRequested(BaseException):
    """A stop was asked for (SIGTERM) while waiting for the writers' lock: the transition did not
    commit (one whose effects were owed resumes them at the next start, as after a crash).
    A BaseException, as KeyboardInterrupt is, so that no `except AgentFsmError` (or Exception)
    takes the stop for a failure, a failed judgment among them; the daemon exits 0 on it."""


class CouldNotRun(AgentFsmError):
    """The command did not start (OSError) or did not finish within its timeout.

    Callers re-raise it as their own error, worded with `reason`; one that does not still
    reaches the user as a single line.
    """

    def __init__(self, argv: Sequence[str], reason: str, error: OSError | None = None) -> None:
        super().__init__(f"`{' '.join(argv)}` could not run: {reason}")
        self.argv = tuple(argv)
        self.reason = reason
        self.error = error  # why it did not start; None when it timed out


class InterpreterUnreadable(AgentFsmError):
    """A Python interpreter asked its ABI ran but did not say what it is; the text says what it
    printed."""


class BadSignature(AgentFsmError):
    """A signature does not verify, or could not be made; the text says why, as ssh-keygen put
    it."""


class ChannelError(AgentFsmError):
    """A channel's document or release is refused, or could not be fetched; nothing changed."""


class Unreachable(ChannelError):
    """A channel's server could not be reached, or did not answer with the file in time."""


class SystemdError(AgentFsmError):
    """A call to systemctl failed."""


class PublishError(AgentFsmError):
    """The result of an upgrade could not be published."""


class WorkloadError(AgentFsmError):
    """The release's workload cannot start as the host config asks."""


class Refused(AgentFsmError):
    """The operation is not allowed now; nothing was changed."""

    exit_code = EXIT_REFUSED


class IllegalTransition(Refused):
    """The trigger has no transition from the current state."""

    def __init__(self, message: str, *, trigger: str, state: str) -> None:
        super().__init__(message)
        self.trigger = trigger
        self.state = state


class NotItsRole(Refused):
    """The transition belongs to another role's process (`by` in states/); nothing was changed."""

    def __init__(self, message: str, *, trigger: str, role: str | None) -> None:
        super().__init__(message)
        self.trigger = trigger
        self.role = role


class RolledBack(AgentFsmError):
    """The candidate was judged failed and the node went back to the last-good."""

    exit_code = EXIT_ROLLED_BACK
