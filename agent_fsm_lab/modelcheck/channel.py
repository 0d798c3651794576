"""The model's channel: an operator's `agent-fsm follow`, and the rules a follow keeps.

The follow runs the real code (`actions.follow.follow`: the trusted root, `trust.accept_index`,
`rollout.choose`, the record, and the begin of the judged upgrade through `upgrade`, as an
operator's `upgrade` does, without waiting). What crosses the process boundary is the model's:
the server's answer to `index.json` is one of `ANSWERS`, signed once per run by ssh-keygen keys
made for the run, and the search branches on which one it gives (a replay is `v1` given after
`v2`). The releases the indexes name are in the store from the start; the model's server holds
no archive (a download is unreachable). The follow's config names the channel; the other
processes' do not (the follow timer's units are not modelled: nothing on the way back reads
them). The wall clock the follow reads is the configuration's.

Rules, checked on every step of a check whose operator commands include `follow`:

- `follow-index-never-back`: the index version `follow.json` records never decreases;
- `follow-refused-changes-nothing`: an answer the node must refuse (expired at the model's
  clock, older than the version recorded, or that version with other bytes) changes nothing:
  no transition, no file but `follow.json` (its outcome), whose recorded index stays as it was;
- `follow-takes-no-revoked-or-known-bad`: an upgrade a follow begins is to a version the answer
  it was given lists, not revoked in the newest index accepted on the path (the search's ghost
  `Config_.index`), not known bad on the node before the step;
- `follow-lists-no-revoked-or-known-bad`: the record a follow writes lists as eligible here no
  version revoked in the answer it was given or known bad (what `status` shows; a choice that
  `begin_upgrade`'s own refusal of a known-bad version would otherwise hide).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agent_fsm.actions.channel import signatures
from agent_fsm.errors import Unreachable
from agent_fsm.node.channel import documents
from agent_fsm.node.channel.documents import Entry, Index, Role, Root
from agent_fsm.node.channel_config import ChannelConfig
from agent_fsm.node.config import Config
from agent_fsm.node.records import known_bad
from agent_fsm.node.releases import signing
from agent_fsm.node.releases import store as release_store
from agent_fsm.node.state.reasons import ReasonClass
from agent_fsm.testing import FakeClock, FakeSystemd
from agent_fsm.wiring import open_node

from .tree import Tree

URL = "https://channel.model.test/stable"
NAME = "stable"
DAY = 86400.0
MACHINE_ID = "0123456789abcdef0123456789abcdef"
MARKED = "3.0.0"  # rolled back here before the first configuration: known bad on the node
VERSIONS = ("1.0.0", "2.0.0", "2.1.0", MARKED)  # stored at the start; the first installed


@dataclass(frozen=True)
class Answer:
    """One index the server may give: its version, expiry, and (version, rollout %, revoked)."""

    label: str
    words: str
    version: int
    expires_in: float  # seconds after the first configuration's clock
    releases: tuple[tuple[str, int, str | None], ...]


ANSWERS = (
    Answer("v1", "index v1: 2.0.0 at 100 %", 1, 30 * DAY, (("2.0.0", 100, None),)),
    Answer("v2", "index v2: 2.0.0 revoked, 2.1.0 added at 100 %", 2, 30 * DAY,
           (("2.0.0", 100, "crashes at start"), ("2.1.0", 100, None))),
    Answer("expired", "index v3 (2.1.0 at 100 %), expired a day before", 3, -DAY,
           (("2.1.0", 100, None),)),
    Answer("known-bad", f"index v4: 2.0.0 and 2.1.0 revoked, {MARKED} (known bad here) at 100 %",
           4, 30 * DAY, (("2.0.0", 100, "crashes at start"), ("2.1.0", 100, "a bad build"),
                         (MARKED, 100, None))),
)
BY_LABEL = {a.label: a for a in ANSWERS}
BY_VERSION = {a.version: a for a in ANSWERS}


@dataclass(frozen=True)
class Channel:
    """What one run prepared: the follow's config, the answers' bytes, the warmed check."""

    config: Config
    clock: float  # the first configuration's wall clock
    served: dict[str, bytes]  # label -> the signed index
    digests: dict[str, str]  # label -> the digest a node records as seen (`trust.digest`)
    check: Any  # trust.Check: ssh-keygen's verdicts, each asked once
    root_doc: bytes  # the channel's root, version 1, as the config's `root` file holds it
    record_rel: str  # `follow.json`, relative to the node's root


def follow_config(config: Config) -> Config:
    return config._replace(channel=ChannelConfig(url=URL, name=NAME,
                                                 machine_id=Path("/etc/machine-id")))


def _keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f",
                    str(path)], check=True, timeout=30, capture_output=True)
    return path


def _digests(root: Path, config: Config) -> dict[str, str]:
    """Each stored release's digest, as `follow` compares it with the index's."""
    releases = open_node(config, root, systemd=FakeSystemd()).paths.releases_dir
    out = {}
    for v in VERSIONS:
        manifest = release_store.recorded(releases, v)
        assert manifest is not None, f"{v} is not stored"
        out[v] = signing.signed_digest(manifest) or release_store.digest(manifest)
    return out


def prepare(root: Path, keys_dir: Path, config: Config, clock: float) -> Channel:
    """Sign the root and every answer with keys made for this run; verify each signature once
    (so that no step runs ssh-keygen, whose temporary files are not the node's); `root` holds a
    first configuration, whose stored releases the indexes name."""
    keys_dir.mkdir(parents=True, exist_ok=True)
    keys = {n: _keygen(keys_dir / n) for n in ("root", "ci")}
    public = {n: signatures.public_key(k) for n, k in keys.items()}
    trusted = Root(1, datetime.fromtimestamp(clock + 5 * 365 * DAY, UTC), public,
                   Role(("root",), 1), Role(("ci",), 1))
    follow = follow_config(config)
    paths = open_node(follow, root, systemd=FakeSystemd()).paths
    digest = _digests(root, config)
    served: dict[str, bytes] = {}
    for a in ANSWERS:
        entries = tuple(Entry(v, digest[v], rollout, archive=f"releases/{v}.tar.gz",
                              sha256="sha256:" + "0" * 64, size=1, revoked=revoked)
                        for v, rollout, revoked in a.releases)
        index = Index(NAME, a.version, datetime.fromtimestamp(clock + a.expires_in, UTC),
                      entries)
        served[a.label] = signatures.sign(index.to_json(), {"ci": keys["ci"]})
    verdicts: dict[tuple[str, str, str, str], bool] = {}

    def check(message: str, name: str, public_key: str, sig: str) -> bool:
        asked = (message, name, public_key, sig)
        if asked not in verdicts:
            verdicts[asked] = signatures.check(*asked)
        return verdicts[asked]

    digests = {}
    for label, data in served.items():
        env = documents.read_envelope(data, label)
        assert all(check(env.message, s.key, public[s.key], s.sig) for s in env.signatures)
        digests[label] = env.message
    return Channel(follow, clock, served, digests, check,
                   signatures.sign(trusted.to_json(), {"root": keys["root"]}),
                   str(paths.channel_dir.relative_to(root) / "follow.json"))


def install(root: Path, channel: Channel) -> None:
    """Into a first configuration's files: the channel's root where the config names it, the
    machine id, and the known-bad mark of `MARKED` (a rollback here before)."""
    paths = open_node(channel.config, root, systemd=FakeSystemd()).paths
    paths.channel_root.parent.mkdir(parents=True, exist_ok=True)
    paths.channel_root.write_bytes(channel.root_doc)
    paths.machine_id.parent.mkdir(parents=True, exist_ok=True)
    paths.machine_id.write_text(MACHINE_ID + "\n")
    known_bad.mark(paths.known_bad_file, known_bad.Mark(
        MARKED, channel.clock - DAY, "judged failed: a check failed", ReasonClass.check_failed.value,
        channel.clock - 2 * DAY))


class _Wall:
    """`datetime` as the follow reads it: `now` is the step's clock."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    def now(self, tz: Any = None) -> datetime:
        return datetime.fromtimestamp(self.clock.now(), tz)


def run(channel: Channel, node: Any, clock: FakeClock, label: str) -> str:
    """One `agent-fsm follow --no-wait` on `node`, the server giving answer `label`; how it
    ended, in words. The step's clock is the follow's wall clock and the recovery wait's."""
    from agent_fsm.actions import follow as follow_mod
    from agent_fsm.actions import upgrade as upgrade_mod

    served = channel.served[label]

    def get(url: str, *, ca: Path | None, limit: int, seconds: float) -> bytes | None:
        return served if url == f"{URL}/index.json" else None  # no root after version 1

    def download(url: str, target: Path, *, ca: Path | None, size: int,
                 seconds: float) -> None:
        raise Unreachable(f"could not fetch {url}: the model's server holds no archive")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(follow_mod, "datetime", _Wall(clock))
        mp.setattr(follow_mod, "time", SimpleNamespace(time=clock.now))
        mp.setattr(upgrade_mod, "time", SimpleNamespace(monotonic=clock.monotonic,
                                                        sleep=clock.sleep, time=clock.now))
        rec = follow_mod.follow(node, wait=False, check=channel.check, get=get,
                                download=download).record
    return f"{rec.outcome.value}: {rec.message}"


def who(label: str, seen: int | None) -> str:
    a = BY_LABEL[label]
    replay = f" (a replay: this node recorded index v{seen})" if seen is not None \
        and a.version < seen else ""
    return f"operator: agent-fsm follow --no-wait; the server gives {a.words}{replay}"


def recorded(channel: Channel, tree: Tree) -> tuple[int, str] | None:
    """The index `follow.json` records as seen: its version and digest (None: none, or no
    record that reads)."""
    return seen_in(tree.file(channel.record_rel))


def seen_in(data: bytes | None) -> tuple[int, str] | None:
    """The index a `follow.json`'s bytes record as seen."""
    if data is None:
        return None
    try:
        seen = json.loads(data)["seen"]
        return None if seen is None else (int(seen["version"]), str(seen["digest"]))
    except (ValueError, KeyError, TypeError):
        return None


def eligible_in(data: bytes | None) -> tuple[str, ...]:
    """The versions a `follow.json`'s bytes list as eligible here (`why_not` null)."""
    try:
        return tuple(str(a["version"]) for a in json.loads(data or b"{}").get("available", ())
                     if a.get("why_not") is None)
    except (ValueError, KeyError, TypeError, AttributeError):
        return ()


def refused(channel: Channel, label: str, clock: float, seen: tuple[int, str] | None) -> str | None:
    """Why the node must refuse answer `label` at `clock`, having recorded `seen`; None if it
    must believe it."""
    a = BY_LABEL[label]
    if channel.clock + a.expires_in <= clock:
        return "it expired"
    if seen is not None and a.version < seen[0]:
        return f"it is older than index v{seen[0]}, which the node recorded (a replay)"
    if seen is not None and a.version == seen[0] and channel.digests[label] != seen[1]:
        return f"it differs from the index v{seen[0]} the node recorded"
    return None


def _begun(fired: list[dict[str, Any]], owed: str | None) -> Iterator[str]:
    """The versions whose upgrade the step began; but the first, when a `begin_upgrade` was
    owed before it: that one is a command's that died, which this one finishes first (chosen
    by a follow, it was checked in the fault-free run of that follow)."""
    skip = owed == "begin_upgrade"
    for entry in fired:
        if entry.get("trigger") == "begin_upgrade" and not entry.get("superseded_by"):
            if skip:
                skip = False
                continue
            up = entry.get("upgrade") or {}
            to = up.get("to") if isinstance(up, dict) else None
            yield str(to or entry.get("release"))


def step_rules(channel: Channel, label: str | None, before: Tree, after: Tree, clock: float,
               marks: frozenset[str], newest: int, fired: list[dict[str, Any]],
               owed: str | None) -> tuple[list[tuple[str, str]], int]:
    """The follow's rules over one step (`label`: the answer a follow was given, None: the
    step was no follow; `marks`: the known-bad marks before it; `owed`: the transition owed
    before it); and the newest index version accepted on the path after it."""
    out: list[tuple[str, str]] = []
    was, now = recorded(channel, before), recorded(channel, after)
    if was is not None and (now is None or now[0] < was[0]):
        out.append(("follow-index-never-back", "the index version follow.json records went "
                    f"from v{was[0]} to {'none' if now is None else f'v{now[0]}'}"))
    if label is None:
        return out, newest
    a = BY_LABEL[label]
    why = refused(channel, label, clock, was)
    if why is not None:
        changed = sorted({e[0] for e in set(before.entries) ^ set(after.entries)
                          if not e[0].startswith(channel.record_rel.rsplit("/", 1)[0])})
        if fired or changed or now != was:
            did = [f"fired {', '.join(str(e.get('trigger')) for e in fired)}"] if fired else []
            did += [f"changed {', '.join(changed[:3])}"] if changed else []
            did += [f"recorded index {'none' if now is None else f'v{now[0]}'}"] if now != was \
                else []
            out.append(("follow-refused-changes-nothing", f"the follow was given {a.words}, "
                        f"which it must refuse ({why}), and {'; '.join(did)}"))
        return out, newest
    if now is not None and now[0] == a.version:
        newest = max(newest, a.version)
    listed = {v: revoked for v, _, revoked in a.releases}
    newest_revoked = {v for v, _, r in BY_VERSION[newest].releases if r} if newest else set()
    if after.file(channel.record_rel) != before.file(channel.record_rel):
        for v in eligible_in(after.file(channel.record_rel)):
            if listed.get(v) is not None or v in marks:
                out.append(("follow-lists-no-revoked-or-known-bad", f"the follow's record lists "
                            f"{v} as eligible here, though it is "
                            + ("revoked in the index given" if listed.get(v) is not None
                               else "known bad on this node")))
    for v in _begun(fired, owed):
        if v not in listed:
            out.append(("follow-takes-no-revoked-or-known-bad", f"the follow began an upgrade "
                        f"to {v}, which {a.words} does not list"))
        elif listed[v] is not None or v in newest_revoked:
            out.append(("follow-takes-no-revoked-or-known-bad", f"the follow began an upgrade "
                        f"to {v}, revoked in index v{newest if v in newest_revoked else a.version}"))
        elif v in marks:
            out.append(("follow-takes-no-revoked-or-known-bad", f"the follow began an upgrade "
                        f"to {v}, known bad on this node"))
    return out, newest
