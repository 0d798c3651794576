"""`agent-fsm channel …`: a release engineer's channel, a directory any static server serves.

    DIR/root.json        the newest root of trust (what a new node is given)
    DIR/root/N.json      every root, so a node chains from the one it trusts to the newest
    DIR/index.json       the signed index: per version, the release, its digest, its rollout
    DIR/releases/…       the archives `publish` copied in

Each command reads the directory as it is, with the index checked against the root. So it never
builds on a changed file. It writes what it adds first and the index last, atomically. A server then
serves the old index or the new one, and every release an index names is already there. Every change
raises the index's version and signs it again with a new expiry.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from ... import files
from ...errors import ChannelError, ReleaseError
from ...node import sha256
from ...node.channel import documents, trust
from ...node.channel.documents import Entry, Index, Role, Root
from ...node.releases.pointers import check_version, natural_key, read_manifest
from ..releases import sources
from ..releases import trust as release_trust
from . import signatures

ROOT_DAYS = 365
INDEX_DAYS = 30
CHUNK = 1 << 20
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")


@dataclass(frozen=True)
class Channel:
    """A channel directory as read, and what the command changed (None: nothing)."""

    directory: Path
    root: Root
    index: Index
    changed: str | None = None


def read(directory: Path) -> Channel:
    """The channel in `directory`, its index checked against its newest root."""
    root_env = _envelope(directory / "root.json", "the channel's root")
    root = documents.parse_root(root_env.body)
    trust.require(root_env, root.roots, root.keys, signatures.check, "root.json")
    env = _envelope(directory / "index.json", "the channel's index")
    trust.require(env, root.indexes, root.keys, signatures.check, "index.json")
    return Channel(directory, root, documents.parse_index(env.body))


def init(directory: Path, channel: str, *, root_keys: Mapping[str, Path],
         index_keys: Mapping[str, Path], threshold: int, now: datetime,
         root_days: int = ROOT_DAYS, index_days: int = INDEX_DAYS) -> Channel:
    """A new channel: root version 1 (signed by every root key given) and an empty index."""
    if (directory / "index.json").exists() or (directory / "root.json").exists():
        raise ChannelError(f"{directory} already holds a channel; nothing was changed")
    index = documents.parse_index(_empty(channel, now, index_days).to_json())  # checks the name
    root = _root(1, root_keys, index_keys, threshold, now + timedelta(days=root_days))
    signed_root = signatures.sign(root.to_json(), root_keys)
    signed_index = _signed(root, index, index_keys)
    _write_root(directory, root, signed_root)
    files.atomic_write(directory / "index.json", signed_index, 0o644)
    return Channel(directory, root, index, f"channel {channel} made, root version 1")


def publish(directory: Path, version: str, *, rollout: int, keys: Mapping[str, Path],
            now: datetime, archive: Path | None = None, image: str | None = None,
            digest: str | None = None, not_before: datetime | None = None,
            days: int = INDEX_DAYS) -> Channel:
    """Add `version` to the index at `rollout` percent. An archive is copied under releases/ and its
    release digest read from it; an image's release digest is given."""
    ch = read(directory)
    check_version(version)
    if ch.index.entry(version) is not None:
        raise ChannelError(f"version {version} is already in the channel; change its rollout "
                           "with `channel rollout`, or revoke it")
    if (archive is None) == (image is None):
        raise ChannelError("give either --archive FILE or --image REF")
    copy = None
    if archive is not None:
        entry = _archive_entry(archive, version, rollout, digest)
        copy = (archive, Path(str(entry.archive)))
    else:
        if digest is None:
            raise ChannelError("an image needs its release digest: --digest sha256:… (what "
                               "`release pack --image` printed)")
        entry = Entry(version, digest, rollout, image=image)
    entry = entry._replace(not_before=not_before)
    documents.parse_index(ch.index._replace(releases=(entry,)).to_json())  # refuses bad fields
    releases = tuple(sorted((*ch.index.releases, entry), key=lambda e: natural_key(e.version)))
    return _change(ch, releases, keys, now, days, f"{version} published at {rollout} %",
                   copy=copy)


def set_rollout(directory: Path, version: str, percent: int, *, keys: Mapping[str, Path],
                now: datetime, days: int = INDEX_DAYS) -> Channel:
    """Raise (or halt, at 0) the rollout of `version`: nodes that took it keep it."""
    ch = read(directory)
    entry = _entry(ch, version)
    if not 0 <= percent <= 100:
        raise ChannelError(f"a rollout is a percentage from 0 to 100, not {percent}")
    what = (f"{version} halted (rollout 0 %, was {entry.rollout} %)" if percent == 0 else
            f"{version} rollout {entry.rollout} % → {percent} %")
    return _change(ch, _replaced(ch, entry._replace(rollout=percent)), keys, now, days, what)


def revoke(directory: Path, version: str, reason: str, *, keys: Mapping[str, Path],
           now: datetime, days: int = INDEX_DAYS) -> Channel:
    """Mark `version` revoked: no node takes it, and nodes running it go to the newest eligible."""
    ch = read(directory)
    entry = _entry(ch, version)
    return _change(ch, _replaced(ch, entry._replace(revoked=reason)), keys, now, days,
                   f"{version} revoked: {reason}")


def refresh(directory: Path, *, keys: Mapping[str, Path], now: datetime,
            days: int = INDEX_DAYS) -> Channel:
    """Sign the index again with a new expiry (a CI job runs it well before the old one)."""
    ch = read(directory)
    return _change(ch, ch.index.releases, keys, now, days, "index signed again")


def rotate(directory: Path, *, root_keys: Mapping[str, Path], index_keys: Mapping[str, Path],
           threshold: int, sign_with: Mapping[str, Path], now: datetime,
           root_days: int = ROOT_DAYS, days: int = INDEX_DAYS) -> Channel:
    """A new root naming new keys, signed by `sign_with`. Those must hold a threshold of both the
    old root's keys and the new one's, or nodes would refuse it (checked here first). The new index
    keys sign the index again (private key files, or public ones in ssh-agent), so nodes on the new
    root believe it."""
    ch = read(directory)
    new = _root(ch.root.version + 1, root_keys, index_keys, threshold,
                now + timedelta(days=root_days))
    data = signatures.sign(new.to_json(), sign_with)
    trust.next_root(ch.root, documents.read_envelope(data, "the new root"), signatures.check)
    index = ch.index._replace(version=ch.index.version + 1, expires=now + timedelta(days=days))
    index_data = _signed(new, index, index_keys)
    _write_root(directory, new, data)
    files.atomic_write(directory / "index.json", index_data, 0o644)
    return Channel(directory, new, index,
                   f"root version {new.version}: {', '.join(new.roots.keys)} sign roots, "
                   f"{', '.join(new.indexes.keys)} the index; index version "
                   f"{ch.index.version + 1} signed by them")


def _change(ch: Channel, releases: tuple[Entry, ...], keys: Mapping[str, Path], now: datetime,
            days: int, what: str, *, copy: tuple[Path, Path] | None = None) -> Channel:
    """Sign the next index, refused here if nodes would refuse it. Copy in what it names (`copy`: an
    archive and its destination), then write it."""
    index = ch.index._replace(version=ch.index.version + 1, releases=releases,
                    expires=now + timedelta(days=days))
    data = _signed(ch.root, index, keys)
    if copy is not None:
        files.atomic_write(ch.directory / copy[1], _chunks(copy[0]), 0o644)
    files.atomic_write(ch.directory / "index.json", data, 0o644)
    return Channel(ch.directory, ch.root, index, f"{what}; index version {index.version}")


def _signed(root: Root, index: Index, keys: Mapping[str, Path]) -> bytes:
    data = signatures.sign(index.to_json(), keys)
    # Refuse before writing what nodes would refuse: keys that are not the root's index keys.
    trust.require(documents.read_envelope(data, "the new index"), root.indexes, root.keys,
                  signatures.check, "the new index (signed by " + ", ".join(keys) + ")")
    return data


def _write_root(directory: Path, root: Root, data: bytes) -> None:
    files.atomic_write(directory / "root" / f"{root.version}.json", data, 0o644)
    files.atomic_write(directory / "root.json", data, 0o644)


def _root(version: int, root_keys: Mapping[str, Path], index_keys: Mapping[str, Path],
          threshold: int, expires: datetime) -> Root:
    keys = {name: signatures.public_key(path) for name, path in {**root_keys,
                                                                **index_keys}.items()}
    root = Root(version, expires, keys, Role(tuple(root_keys), threshold),
                Role(tuple(index_keys), 1))
    return documents.parse_root(root.to_json())  # the same checks a node makes


def _empty(channel: str, now: datetime, days: int) -> Index:
    return Index(channel, 1, now + timedelta(days=days), ())


def _entry(ch: Channel, version: str) -> Entry:
    entry = ch.index.entry(version)
    if entry is None:
        listed = ", ".join(e.version for e in ch.index.releases) or "none"
        raise ChannelError(f"version {version} is not in the channel (it lists {listed})")
    return entry


def _replaced(ch: Channel, entry: Entry) -> tuple[Entry, ...]:
    return tuple(entry if e.version == entry.version else e for e in ch.index.releases)


def _envelope(path: Path, what: str) -> documents.Envelope:
    try:
        data = files.read_regular(path, documents.MAX_DOCUMENT + 1)
    except FileNotFoundError:
        raise ChannelError(f"{path} is missing: is {path.parent} a channel (`channel init`)?"
                           ) from None
    except (OSError, ValueError) as exc:  # ValueError: a link, not a file, or too large
        raise ChannelError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}"
                           ) from None
    return documents.read_envelope(data, f"{what} ({path})")


def _archive_entry(archive: Path, version: str, rollout: int,
                   digest: str | None) -> Entry:
    suffix = next((s for s in ARCHIVE_SUFFIXES if archive.name.endswith(s)), None)
    if suffix is None:
        raise ChannelError(f"{archive} is not a release archive (.tar, .tar.gz, .tgz)")
    found = _release_digest(archive, version)
    if digest is not None and digest != found:
        raise ChannelError(f"{archive} holds release digest {found}, not {digest}")
    name = f"releases/{version}{suffix}"
    sha256.prefer_openssl()  # an archive may be gigabytes
    try:
        sha, size = sha256.of_file(archive)
    except OSError as exc:
        raise ChannelError(f"cannot read {archive}: {exc.strerror or exc}") from None
    return Entry(version, found, rollout, archive=name, sha256="sha256:" + sha, size=size)


def _release_digest(archive: Path, version: str) -> str:
    """The release digest (what its signature covers) of the release in `archive`, unpacked in a
    private directory as `release add` would."""
    with files.private_dir(prefix="agent-fsm-publish.") as tmp:
        sources.unpack(archive, tmp / "release")
        top = sources.release_root(archive, tmp / "release")
        try:
            found = read_manifest(top / "release.toml").version
        except ReleaseError as exc:
            raise ChannelError(str(exc)) from None
        if found != version:
            raise ChannelError(f"{archive} holds release {found}, not {version}")
        return release_trust.digest(top)


def _chunks(path: Path) -> Iterator[bytes]:
    try:
        with path.open("rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk
    except OSError as exc:
        raise ChannelError(f"cannot read {path}: {exc.strerror or exc}") from None
