"""The errors agent-fsm raises, all under one root.

    AgentFsmError                  exit 1: the message says what is wrong and what to do
    ├── ConfigError                the config file is missing, unparsable or has a bad value
    ├── DefinitionError            states/agent-upgrade.toml is inconsistent
    ├── Invalid                    a field of a file read back is not valid
    ├── StateFileError             state.json is damaged, newer or unknown; left untouched
    │   └── DocumentError          a file of the state dir is refused
    ├── SignalError                the upgrade signal is unreadable
    ├── KnownBadDamaged            known-bad.json is damaged; left untouched
    ├── ReleaseError               a release is missing or malformed
    │   ├── BadTree                a release tree holds what the store refuses, or is too big
    │   ├── NoRoom                 a release does not fit the store's disk
    │   └── BadArchive             a release archive is not tar, damaged, or too big
    ├── AssetError                 a service asset could not be rendered, restored or kept
    ├── UnsafePath                 a path to write is a symlink, or others may write there
    │   └── NeedsRoot              the state dir is root's and this process is not
    ├── DiskError                  a write, fsync, rename or mkdir failed
    ├── LockTimeout                another process held a lock too long
    ├── CouldNotRun                a command did not start or timed out
    ├── InterpreterUnreadable      a Python asked its ABI did not say
    ├── BadSignature               a signature did not verify or could not be made
    ├── ChannelError               a channel's root, index or release is refused
    │   └── Unreachable            its server did not answer with the file in time
    ├── SystemdError               a systemctl call failed
    ├── PublishError               publishing a result failed (the daemon retries)
    ├── WorkloadError              the release's workload cannot start
    ├── Refused                    exit 3: the operation may not run now; nothing changed
    │   ├── IllegalTransition      the trigger has no transition from this state
    │   └── NotItsRole             the transition belongs to another role's process
    └── RolledBack                 exit 4: `upgrade --wait` saw the candidate judged failed

The CLI prints each as one line on stderr and exits with its code; no traceback reaches a user.

`StopRequested` is no error: a SIGTERM while waiting for the writers' lock, unwinding the daemon
to a clean exit.
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
    """One field of a file read back is not valid; the message names it and its value.

    A ValueError too, so readers catch it with their parser's errors and name the file.
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


class StateFileError(AgentFsmError):
    """The state file cannot be trusted; it is never overwritten."""


class DocumentError(StateFileError):
    """A file of the state dir is damaged, newer or not valid; it is left untouched."""

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
    """An entry the release store refuses, or a tree over the limits: `path`, then why."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path} {why}")


class NoRoom(ReleaseError):
    """A release does not fit the store's disk: what it needs, what is free, what is kept."""


class BadArchive(ReleaseError):
    """A tar archive refused while read; the reason is a clause ("it is not a tar archive")."""


class AssetError(AgentFsmError):
    """A service asset could not be rendered, restored or kept (a failed write is a DiskError)."""


class UnsafePath(AgentFsmError):
    """A path agent-fsm writes is a symlink, or a directory others may write to."""


class NeedsRoot(UnsafePath):
    """What this process must use is root's, and it does not run as root."""


class DiskError(AgentFsmError):
    """A write, fsync, rename, unlink, symlink, chmod or mkdir in `files` failed; the message
    says what to do."""


class LockTimeout(AgentFsmError):
    """Another process held a lock longer than the caller would wait; the message is the lock's path."""


class StopRequested(BaseException):
    """A SIGTERM arrived while waiting for the writers' lock; the transition did not commit.

    A BaseException, like KeyboardInterrupt, so no `except Exception` takes it for a failure.
    The daemon exits 0; owed effects resume at the next start.
    """


class CouldNotRun(AgentFsmError):
    """The command did not start (OSError) or did not finish within its timeout.

    Callers re-raise it as their own error, worded with `reason`.
    """

    def __init__(self, argv: Sequence[str], reason: str, error: OSError | None = None) -> None:
        super().__init__(f"`{' '.join(argv)}` could not run: {reason}")
        self.argv = tuple(argv)
        self.reason = reason
        self.error = error  # why it did not start; None when it timed out


class InterpreterUnreadable(AgentFsmError):
    """A Python asked its ABI ran but did not say; the text is what it printed."""


class BadSignature(AgentFsmError):
    """A signature does not verify or could not be made; the text is ssh-keygen's reason."""


class ChannelError(AgentFsmError):
    """A channel's document or release is refused or could not be fetched; nothing changed."""


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
