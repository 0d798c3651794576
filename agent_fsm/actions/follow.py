"""`agent-fsm follow`: one look at the node's channel, and the judged upgrade it calls for.

The steps, each changing nothing on the node when it fails:
1. chain from the root the node believes to the channel's newest (`root/N.json`, each signed
   by the one before);
2. fetch and believe the index (signed, not expired, not older than the last believed), and
   keep it as the newest seen;
3. choose the newest version eligible here (`node.channel.rollout`);
4. unless a hold, inhibitor or pending upgrade stands in the way, fetch it (an archive resumed
   and checked against the index's size and sha256, or an image), add it (`release add`, its
   digest checked against the index's), and upgrade to it as `upgrade --wait` does.

The follow's record (`node.channel.record`) says what happened and why no other version was taken.
`status` shows it. An unreachable server is tried again at the next follow.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from .. import files
from ..errors import (
    AgentFsmError,
    ChannelError,
    ConfigError,
    LockTimeout,
    Refused,
    Unreachable,
)
from ..machine.vocabulary import StateName
from ..node import sha256
from ..node.assets.follow_units import judgment_seconds
from ..node.channel import documents, rollout, trust
from ..node.channel import record as channel_record
from ..node.channel.documents import Entry, Index, Root
from ..node.channel.record import Available, Outcome, Record, Seen
from ..node.channel_config import MAX_ROOTS
from ..node.records import known_bad
from ..node.releases import signing
from ..node.releases import store as release_store
from ..node.state import lock
from ..system import fetch
from ..untrusted import shown
from ..upgrade import overrides
from ..wiring import Node
from .channel import signatures
from .releases import sources
from .upgrade import Upgraded, upgrade


@dataclass(frozen=True)
class Followed:
    record: Record
    upgraded: Upgraded | None = None


Get = Callable[..., bytes | None]


def follow(node: Node, *, wait: bool = True, check: trust.Check = signatures.check,
           get: Get = fetch.get, download: Callable[..., None] = fetch.download) -> Followed:
    """One follow; what happened is recorded and returned. Refused while another follow runs on the
    node (the timer's or an operator's)."""
    if node.config.channel.url is None:
        raise ConfigError("this node follows no channel: set `[channel] url` (and `root`) in "
                          "its config (docs/fleet.md)")
    files.ensure_private_dir(node.paths.channel_dir)
    try:
        with lock.held(node.paths.channel_dir / "follow.lock", timeout=0):
            return _follow(node, wait, check, get, download)
    except LockTimeout:
        raise Refused("another `agent-fsm follow` is running on this node; this one did "
                      "nothing") from None


def _follow(node: Node, wait: bool, check: trust.Check, get: Get,
            download: Callable[..., None]) -> Followed:
    cfg = node.config.channel
    directory = node.paths.channel_dir
    last = channel_record.read(directory)
    seen = None if last is None else last.seen
    root, _ = channel_record.trusted_root(directory, node.paths.channel_root)
    started = time.time()

    def done(outcome: Outcome, message: str, *, available: tuple[Available, ...] = (),
             took: str | None = None, upgraded: Upgraded | None = None) -> Followed:
        rec = Record(started, outcome, message, root.version, seen, took, available)
        channel_record.write(directory, rec)
        return Followed(rec, upgraded)

    try:
        root = _newest_root(node, root, check, get)
        env = _fetch(get, f"{cfg.url}/index.json", node, "the index")
        if env is None:
            raise Unreachable(f"{shown(cfg.url)}/index.json answered 404: is `[channel] url` "
                              "the channel's directory?")
        index = trust.accept_index(root, env, channel=cfg.name, seen=seen,
                                   now=datetime.now(UTC), check=check)
    except Unreachable as exc:
        return done(Outcome.failed, f"{exc}; nothing changed; the next follow tries again")
    except ChannelError as exc:
        return done(Outcome.refused, f"{exc}; nothing changed")
    seen = Seen(index.version, trust.digest(env))
    choice = _choose(node, index)
    available = _available(index, choice)
    if choice.take is None:
        outcome = Outcome.up_to_date if choice.why.startswith("up to date") \
            else Outcome.nothing_eligible
        return done(outcome, f"index version {index.version}: {choice.why}", available=available)
    entry = choice.take
    blocked = _blocked(node, entry.version)
    if blocked is not None:
        return done(Outcome.held, f"index version {index.version}: {entry.version} is eligible, "
                    f"but {blocked}; nothing fetched", available=available)
    try:
        _stored(node, entry, download)
        up = upgrade(node, entry.version, wait=wait, timeout=_wait_for(node),
                     channel={"name": cfg.name, "index_version": index.version})
    except Refused as exc:
        return done(Outcome.held, f"{entry.version}: {exc}", available=available)
    except Unreachable as exc:
        return done(Outcome.failed, f"{exc}; the next follow tries again", available=available)
    except ChannelError as exc:
        return done(Outcome.refused, f"{exc}; nothing changed", available=available)
    except AgentFsmError as exc:
        return done(Outcome.failed, f"{entry.version}: {exc}", available=available)
    said = {"ok": (Outcome.upgraded, "judged ok"),
            "rolled_back": (Outcome.rolled_back, f"judged failed and rolled back: {up.reason}"),
            None: (Outcome.started, "upgrade begun")}[up.outcome]
    return done(said[0], f"index version {index.version}: {up.from_version} → {entry.version}"
                f" ({choice.why}): {said[1]}", available=available, took=entry.version,
                upgraded=up)


def _fetch(get: Get, url: str, node: Node, what: str) -> documents.Envelope | None:
    cfg = node.config.channel
    data = get(url, ca=_ca(node), limit=documents.MAX_DOCUMENT, seconds=cfg.timeout_seconds)
    if data is None:
        return None
    return documents.read_envelope(data, f"{what} ({shown(url)})")


def _newest_root(node: Node, root: Root, check: trust.Check, get: Get) -> Root:
    """Chain to the channel's newest root, keeping each one believed."""
    for _ in range(MAX_ROOTS):
        env = _fetch(get, f"{node.config.channel.url}/root/{root.version + 1}.json", node,
                     f"root version {root.version + 1}")
        if env is None:
            break
        root = trust.next_root(root, env, check)
        channel_record.keep_root(node.paths.channel_dir,
                                 documents.envelope(env.body, env.signatures))
    return root


def _ca(node: Node) -> Path | None:
    ca = node.config.channel.ca
    return None if ca is None else node.paths.real(ca)


def _choose(node: Node, index: Index) -> rollout.Choice:
    try:
        machine_id = node.paths.machine_id.read_text(encoding="ascii").strip()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the machine id {node.paths.machine_id}: {exc}") from None
    if not machine_id:
        raise ConfigError(f"the machine id {node.paths.machine_id} is empty")
    bad = known_bad.read(node.paths.known_bad_file).marks
    return rollout.choose(index, running=node.releases.selected(), machine_id=machine_id,
                          known_bad=bad, now=datetime.now(UTC))


def _available(index: Index, choice: rollout.Choice) -> tuple[Available, ...]:
    rollouts = {e.version: e.rollout for e in index.releases}
    return tuple(Available(v.version, rollouts[v.version], v.bucket, v.why_not)
                 for v in choice.verdicts)


def _blocked(node: Node, version: str) -> str | None:
    """Why an upgrade to `version` would be refused now, before anything is fetched."""
    doc = node.store.read()
    if doc.state != StateName.converged.value or doc.upgrade is not None:
        return f"the node is {doc.state}, not converged"
    for o in overrides.OVERRIDES:
        refused = o.refusal(node.paths, node.clock.now(), version)
        if refused is not None:
            return str(refused)
    return None


def _release_digest(node: Node, version: str) -> str | None:
    manifest = release_store.recorded(node.paths.releases_dir, version)
    if manifest is None:
        return None
    return signing.signed_digest(manifest) or release_store.digest(manifest)


def _stored(node: Node, entry: Entry, download: Callable[..., None]) -> None:
    """The release of `entry` in the store with the digest the index names, fetched and added unless
    already there."""
    if (node.paths.releases_dir / entry.version).is_dir():
        have = _release_digest(node, entry.version)
        if have != entry.digest:
            raise ChannelError(f"{entry.version} is stored here with release digest {have}, "
                               f"but the channel names {entry.digest}")
        return
    if entry.image is not None:
        sources.add_source(entry.image, node)
    else:
        archive = _downloaded(node, entry, download)
        sources.add_archive(archive, node)
        archive.unlink()
    have = _release_digest(node, entry.version)
    if have != entry.digest:
        from .releases.pruning import prune

        prune(node, (entry.version,))
        raise ChannelError(f"the release fetched for {entry.version} has release digest {have}, "
                           f"not {entry.digest} as the index says; it was removed")


def _downloaded(node: Node, entry: Entry, download: Callable[..., None]) -> Path:
    cfg = node.config.channel
    assert entry.archive is not None and entry.size is not None
    downloads = node.paths.channel_dir / "downloads"
    files.ensure_private_dir(node.paths.channel_dir)
    files.ensure_private_dir(downloads)
    target = downloads / f"{entry.version}.tar"
    url = entry.archive if entry.archive.startswith("https://") else f"{cfg.url}/{entry.archive}"
    download(url, target, ca=_ca(node), size=entry.size, seconds=cfg.download_seconds)
    sha256.prefer_openssl()  # an archive may be gigabytes
    sha, _ = sha256.of_file(target)
    if "sha256:" + sha != entry.sha256:
        target.unlink()
        raise ChannelError(f"the archive of {entry.version} from {shown(url)} has sha256 "
                           f"{sha}, not what the index says; it was removed")
    return target


def _wait_for(node: Node) -> float:
    return judgment_seconds(node.config)
