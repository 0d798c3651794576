"""Which of a channel's documents a node believes.

A root is believed when it is the next version after the trusted one, and a threshold of both the
trusted root's `root` keys and its own signed it. So keys rotate without a visit to the node. An
index is believed when a threshold of the root's `index` keys signed it, it names the node's
channel, and it has not expired (a frozen channel). Its version may not be below the last one seen
(a replay), and the same version must be the same bytes. A `Check` the caller gives verifies
signatures (ssh-keygen, at the process boundary); the rest is pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import NamedTuple

from ...errors import ChannelError
from .documents import Envelope, Index, Role, Root, parse_index, parse_root, stamp

# (message `sha256:<hex>`, key name, public key, armored signature) -> whether it verifies
Check = Callable[[str, str, str, str], bool]


class Seen(NamedTuple):
    """The newest index a node believed: its version and the digest of its signed bytes."""

    version: int
    digest: str


def digest(env: Envelope) -> str:
    return env.message


def signers(env: Envelope, role: Role, keys: Mapping[str, str], check: Check) -> tuple[str, ...]:
    """The keys of `role` whose signature of `env` verifies, until the threshold is reached."""
    good: list[str] = []
    for s in env.signatures:
        if s.key in role.keys and s.key not in good and check(env.message, s.key, keys[s.key], s.sig):
            good.append(s.key)
            if len(good) == role.threshold:
                break
    return tuple(good)


def require(env: Envelope, role: Role, keys: Mapping[str, str], check: Check, what: str) -> None:
    """ChannelError unless a threshold of `role`'s keys signed `env`."""
    good = signers(env, role, keys, check)
    if len(good) < role.threshold:
        names = ", ".join(role.keys)
        said = "no signature" if not env.signatures else (
            f"{len(good)} good signature{'s' * (len(good) != 1)}")
        raise ChannelError(f"{what} has {said} of the keys this node trusts for it "
                           f"({role.threshold} of {names} needed)")


def next_root(trusted: Root, env: Envelope, check: Check) -> Root:
    """The root after `trusted`, believed; ChannelError if it is not."""
    what = f"the channel's root version {trusted.version + 1}"
    require(env, trusted.roots, trusted.keys, check, f"{what} (by the keys of version "
                                                     f"{trusted.version})")
    new = parse_root(env.body, what)
    if new.version != trusted.version + 1:
        raise ChannelError(f"{what} says it is version {new.version}")
    require(env, new.roots, new.keys, check, f"{what} (by its own keys)")
    return new


def accept_index(root: Root, env: Envelope, *, channel: str, seen: Seen | None, now: datetime,
                 check: Check) -> Index:
    """The index in `env`, believed; ChannelError, in one line, if it is not."""
    if root.expires <= now:
        raise ChannelError(f"the channel's root version {root.version} expired at "
                           f"{stamp(root.expires)}: the release engineer publishes a new root")
    require(env, root.indexes, root.keys, check, "the index")
    index = parse_index(env.body)
    if index.channel != channel:
        raise ChannelError(f"the index is of channel {index.channel}, not {channel}")
    if seen is not None and index.version < seen.version:
        raise ChannelError(f"index version {index.version} is older than version "
                           f"{seen.version} this node has seen: a replayed index")
    if seen is not None and index.version == seen.version and digest(env) != seen.digest:
        raise ChannelError(f"index version {index.version} differs from the version "
                           f"{seen.version} this node saw before")
    if index.expires <= now:
        raise ChannelError(f"index version {index.version} expired at {stamp(index.expires)}: "
                           "a frozen channel (its publisher re-signs it before it expires)")
    return index
