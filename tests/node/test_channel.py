"""A channel's documents, what a node believes of them, and which version it takes: the pure
part of following a channel (signatures are checked by a stand-in for ssh-keygen that binds the
key to the exact bytes, so a changed byte or another key fails as with the real one)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agent_fsm.errors import ChannelError
from agent_fsm.node.channel import documents as docs
from agent_fsm.node.channel import rollout, trust
from agent_fsm.node.channel.documents import Entry, Index, Role, Root, Signature

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)  # only compared with times these tests build
LATER = NOW + timedelta(days=30)
DIGEST = "sha256:" + "ab" * 32
KEYS = {name: f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA{name.upper():A<20}"
        for name in ("primary", "backup", "online", "stranger")}


def sign(body: dict[str, object], *names: str) -> bytes:
    message = docs.message(docs.canonical(body))
    return docs.envelope(body, tuple(Signature(n, _sig(message, n)) for n in names))


def _sig(message: str, name: str) -> str:
    return hashlib.sha256(f"{KEYS[name]}\0{message}".encode()).hexdigest()


def check(message: str, name: str, public_key: str, sig: str) -> bool:
    return hashlib.sha256(f"{public_key}\0{message}".encode()).hexdigest() == sig


def a_root(version: int = 1, *, root_keys: tuple[str, ...] = ("primary", "backup"),
           index_keys: tuple[str, ...] = ("online", "backup"), threshold: int = 1) -> Root:
    return Root(version, LATER, {k: KEYS[k] for k in {*root_keys, *index_keys}},
                Role(root_keys, threshold), Role(index_keys, 1))


def an_index(version: int = 1, *entries: Entry, expires: datetime = LATER) -> Index:
    return Index("stable", version, expires, entries or (Entry("1.0.0", DIGEST, 100,
                                                               image="docker://r/a:1"),))


def believe(data: bytes, *, root: Root | None = None, seen: trust.Seen | None = None,
            now: datetime = NOW) -> Index:
    env = docs.read_envelope(data, "the index")
    return trust.accept_index(root or a_root(), env, channel="stable", seen=seen, now=now,
                              check=check)


class TestDocuments:
    def test_an_index_reads_back_as_it_was_written(self) -> None:
        """An index with every field, published and read again, is the same index."""
        entry = Entry("2.0.0", DIGEST, 34, archive="releases/2.0.0.tar.gz", sha256=DIGEST,
                      size=123, not_before=NOW, revoked="bad build")
        index = an_index(7, entry, Entry("1.0.0", DIGEST, 100, image="docker://r/a:1"))
        env = docs.read_envelope(sign(index.to_json(), "online"), "the index")
        assert docs.parse_index(env.body) == index

    def test_a_root_reads_back_as_it_was_written(self) -> None:
        """A root, published and read again, is the same root."""
        root = a_root(3, threshold=2)
        assert docs.parse_root(docs.read_envelope(sign(root.to_json()), "r").body) == root

    @pytest.mark.parametrize(("mutate", "words"), [
        (lambda b: b.update(extra=1), "unknown key 'extra'"),
        (lambda b: b.pop("expires"), "missing key 'expires'"),
        (lambda b: b.update(version=1.5), "`version` is not a whole number"),
        (lambda b: b.update(version=True), "`version` is not a whole number"),
        (lambda b: b["releases"][0].update(rollout=101), "`rollout` 101 is over 100"),
        (lambda b: b["releases"][0].update(digest="md5:x"), "is not sha256:"),
        (lambda b: b["releases"][0].update(archive="../../etc/shadow", sha256=DIGEST, size=1,
                                           image=None) or b["releases"][0].pop("image"),
         "neither a path under the channel nor an https URL"),
        (lambda b: b["releases"][0].update(archive="a.tar", sha256=DIGEST, size=1),
         "exactly one of `archive` and `image`"),
        (lambda b: b["releases"][0].update(image="docker://r/a:1\nX-Evil: 1"),
         "a space or a control character"),
        (lambda b: b["releases"][0].update(version="1.0\n"), "is not a release version"),
        (lambda b: b["releases"].append(dict(b["releases"][0])), "listed twice"),
        (lambda b: b.update(expires="tomorrow"), "is not a time"),
        (lambda b: b.update(expires="2027-01-01T00:00:00"), "is not a time"),  # no zone
        (lambda b: b.update(type="agent-fsm-channel-root"), "is not of type"),
    ])
    def test_a_malformed_index_is_refused_naming_the_field(
            self, mutate: Callable[[dict[str, Any]], object], words: str) -> None:
        """Each malformed field is refused with one message that names it."""
        body = an_index().to_json()
        mutate(body)
        with pytest.raises(ChannelError, match=words.replace("(", r"\(").replace(")", r"\)")):
            believe(sign(body, "online"))

    @pytest.mark.parametrize(("data", "words"), [
        (b"x" * (docs.MAX_DOCUMENT + 1), "larger than"),
        (b'{"signed": {}, "signed": {}, "signatures": []}', "appears twice"),
        (b'{"signed": {"version": NaN}, "signatures": []}', "not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
        (b'{"signed": "\\ud800", "signatures": []}', "not a signed document"),
        (b'{"signed": {"a": "\\ud800"}, "signatures": []}', "not UTF-8"),
        (b"\xff\xfe", "not valid JSON"),
        (b'{"signed": {}}', "not a signed document"),
    ])
    def test_what_is_no_envelope_is_refused_in_one_line(self, data: bytes, words: str) -> None:
        """An oversized, duplicated, deeply nested or undecodable document is refused in one
        line, with no traceback."""
        with pytest.raises(ChannelError, match=words) as caught:
            docs.read_envelope(data, "the index")
        assert "\n" not in str(caught.value)


class TestTrust:
    def test_an_index_signed_by_the_index_key_is_believed(self) -> None:
        """The online key the root names for the index signs it: the node believes it."""
        assert believe(sign(an_index(5).to_json(), "online")).version == 5

    @pytest.mark.parametrize(("signers", "words"), [
        ((), "has no signature"),
        (("stranger",), "0 good signatures"),
        (("primary",), "0 good signatures"),  # a root key is not an index key
    ])
    def test_an_index_not_signed_by_an_index_key_is_refused(self, signers: tuple[str, ...],
                                                             words: str) -> None:
        """Unsigned, signed by an unknown key, or by a key of another role: refused."""
        root = a_root()._replace(keys={**a_root().keys, "stranger": KEYS["stranger"]})
        with pytest.raises(ChannelError, match=words):
            believe(sign(an_index().to_json(), *signers), root=root)

    def test_a_tampered_index_is_refused(self) -> None:
        """One byte of the signed body changed after signing (a rollout raised): refused."""
        data = sign(an_index().to_json(), "online").replace(b'"rollout":100', b'"rollout":99')
        assert b'"rollout":99' in data
        with pytest.raises(ChannelError, match="0 good signatures"):
            believe(data)

    def test_a_replayed_older_index_is_refused(self) -> None:
        """An index older than the one the node saw is refused; the same one again is not."""
        env = docs.read_envelope(sign(an_index(9).to_json(), "online"), "i")
        seen = trust.Seen(9, trust.digest(env))
        assert believe(sign(an_index(9).to_json(), "online"), seen=seen).version == 9
        with pytest.raises(ChannelError, match="older than version 9 this node has seen"):
            believe(sign(an_index(8).to_json(), "online"), seen=seen)

    def test_the_same_version_with_other_content_is_refused(self) -> None:
        """Version 9 again, but with another release list: refused."""
        env = docs.read_envelope(sign(an_index(9).to_json(), "online"), "i")
        other = an_index(9, Entry("6.6.6", DIGEST, 100, image="docker://r/evil:1"))
        with pytest.raises(ChannelError, match="differs from the version 9"):
            believe(sign(other.to_json(), "online"), seen=trust.Seen(9, trust.digest(env)))

    def test_an_expired_index_is_refused(self) -> None:
        """An index past its expiry (a frozen channel) is refused, naming when it expired."""
        with pytest.raises(ChannelError, match="expired at 2026-12-03T11:00:00Z"):
            believe(sign(an_index(expires=NOW - timedelta(hours=1)).to_json(), "online"))

    def test_an_expired_root_is_refused(self) -> None:
        """A root past its expiry makes every index refused until a new root is published."""
        with pytest.raises(ChannelError, match="root version 1 expired"):
            believe(sign(an_index().to_json(), "online"), root=a_root()._replace(expires=NOW))

    def test_another_channels_index_is_refused(self) -> None:
        """An index signed for `beta` is not believed by a node that follows `stable`."""
        with pytest.raises(ChannelError, match="of channel beta, not stable"):
            believe(sign(an_index()._replace(channel="beta").to_json(), "online"))

    def test_keys_rotate_to_the_backup_without_a_visit(self) -> None:
        """Root 2, signed by the backup key of root 1 and by itself, drops the lost primary and
        names a new index key: the node believes it and then the index the new key signs."""
        r2 = a_root(2, root_keys=("backup",), index_keys=("backup",))
        new = trust.next_root(a_root(), docs.read_envelope(sign(r2.to_json(), "backup"), "r"),
                              check)
        assert new == r2
        assert believe(sign(an_index().to_json(), "backup"), root=new).version == 1
        with pytest.raises(ChannelError, match="0 good signatures"):
            believe(sign(an_index().to_json(), "online"), root=new)

    @pytest.mark.parametrize(("r2", "signers", "words"), [
        # signed only by a key root 1 does not trust for roots
        (a_root(2, root_keys=("stranger",)), ("stranger",), "by the keys of version 1"),
        # signed by root 1's key, but not by its own (threshold 1 of `stranger`)
        (a_root(2, root_keys=("stranger",)), ("primary",), "by its own keys"),
        # a version skipped
        (a_root(3), ("primary",), "says it is version 3"),
    ])
    def test_a_root_that_does_not_chain_is_refused(self, r2: Root, signers: tuple[str, ...],
                                                     words: str) -> None:
        """A new root must be the next version and signed by the old root's keys and its own."""
        with pytest.raises(ChannelError, match=words):
            trust.next_root(a_root(), docs.read_envelope(sign(r2.to_json(), *signers), "r"),
                            check)

    def test_a_threshold_needs_that_many_distinct_keys(self) -> None:
        """With a threshold of 2, one key signing twice is not enough; two keys are."""
        r2 = a_root(2)
        strict = a_root()._replace(roots=Role(("primary", "backup"), 2))
        with pytest.raises(ChannelError, match="1 good signature of"):
            trust.next_root(strict, docs.read_envelope(sign(r2.to_json(), "primary", "primary"),
                                                       "r"), check)
        env = docs.read_envelope(sign(r2.to_json(), "primary", "backup"), "r")
        assert trust.next_root(strict, env, check) == r2


MACHINE_IDS = [hashlib.md5(str(i).encode()).hexdigest() for i in range(10_000)]


class TestBuckets:
    @pytest.mark.parametrize("percent", [1, 10, 34, 50, 90, 99])
    def test_a_rollout_of_p_percent_takes_p_percent_of_the_nodes(self, percent: int) -> None:
        """Over 10,000 machine ids, a rollout of P % covers P ± 1 % of them."""
        taken = sum(rollout.covers(percent, rollout.bucket(m, "2.0.0")) for m in MACHINE_IDS)
        assert abs(taken / len(MACHINE_IDS) * 100 - percent) <= 1

    def test_raising_a_rollout_never_takes_a_node_out(self) -> None:
        """Every node covered at P % is still covered at each higher percentage."""
        for m in MACHINE_IDS[:2000]:
            b = rollout.bucket(m, "2.0.0")
            covered = [rollout.covers(p, b) for p in range(101)]
            assert covered == sorted(covered)  # False… then True…

    def test_a_nodes_bucket_is_stable_and_differs_by_version(self) -> None:
        """A node's bucket is the same at every follow, and the first 10 % of one version are
        not the first 10 % of the next."""
        assert [rollout.bucket(m, "2.0.0") for m in MACHINE_IDS[:50]] == \
               [rollout.bucket(m + "\n", "2.0.0") for m in MACHINE_IDS[:50]]  # as read from a file
        first = {m for m in MACHINE_IDS if rollout.bucket(m, "2.0.0") < 10}
        second = {m for m in MACHINE_IDS if rollout.bucket(m, "2.1.0") < 10}
        assert len(first & second) < len(first) / 3


def entry(version: str, rollout_: int = 100, *, revoked: str | None = None,
          not_before: datetime | None = None) -> Entry:
    return Entry(version, DIGEST, rollout_, image=f"docker://r/a:{version}", revoked=revoked,
                 not_before=not_before)


def choose(*entries: Entry, running: str | None = "1.0.0", machine: str = MACHINE_IDS[0],
           known_bad: tuple[str, ...] = ()) -> rollout.Choice:
    return rollout.choose(an_index(1, *entries), running=running, machine_id=machine,
                          known_bad=known_bad, now=NOW)


class TestChoose:
    def test_the_newest_eligible_version_is_taken(self) -> None:
        """1.0.0 runs; 1.1.0 and 1.10.0 are out at 100 %: the node takes 1.10.0."""
        c = choose(entry("1.0.0"), entry("1.1.0"), entry("1.10.0"))
        assert c.take is not None and c.take.version == "1.10.0"
        assert [v.version for v in c.verdicts] == ["1.10.0", "1.1.0", "1.0.0"]

    def test_each_version_not_taken_says_why(self) -> None:
        """Revoked, known bad here, not yet due and outside the rollout: each its own words,
        with the node's bucket; the newest version eligible is taken."""
        out = next(m for m in MACHINE_IDS if rollout.bucket(m, "1.5.0") >= 10)
        c = choose(entry("1.1.0"), entry("1.2.0", revoked="leaks memory"), entry("1.3.0"),
                   entry("1.4.0", not_before=NOW + timedelta(hours=2)), entry("1.5.0", 10),
                   machine=out, known_bad=("1.3.0",))
        why = {v.version: v.why_not for v in c.verdicts}
        assert why == {"1.5.0": f"rollout 10 %, this node's bucket {rollout.bucket(out, '1.5.0')}",
                       "1.4.0": "not before 2026-12-03T14:00:00Z", "1.3.0": "known bad here",
                       "1.2.0": "revoked: leaks memory", "1.1.0": None}
        assert c.take is not None and c.take.version == "1.1.0"

    def test_a_node_is_never_taken_back_unless_its_version_is_revoked(self) -> None:
        """1.2.0 runs and only 1.1.0 is eligible: nothing is done; once 1.2.0 is revoked, the
        node goes to 1.1.0."""
        assert choose(entry("1.1.0"), entry("1.2.0", 0), running="1.2.0").take is None
        c = choose(entry("1.1.0"), entry("1.2.0", revoked="corrupts data"), running="1.2.0")
        assert c.take is not None and c.take.version == "1.1.0"
        assert c.why == "1.2.0 is revoked: 1.1.0 is the newest eligible"

    def test_up_to_date_and_nothing_eligible_say_so(self) -> None:
        """Running the newest eligible is up to date; a revoked version with nowhere to go says
        that."""
        assert choose(entry("1.0.0")).why.startswith("up to date: 1.0.0 runs")
        assert choose(entry("1.0.0", revoked="x")).why == \
            "1.0.0 is revoked, and no version is eligible to go to"
