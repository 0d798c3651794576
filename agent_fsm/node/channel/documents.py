"""A channel's signed documents as data: the root of trust and the index.

Both are JSON envelopes, `{"signed": {...}, "signatures": [{"key": NAME, "sig": ARMORED}]}`. The
signature covers the canonical form of `signed` (sorted keys, no spaces, UTF-8, integers only) in
ssh-keygen's `agent-fsm-channel` namespace. The signed message is the ASCII text `sha256:<hex>` of
those bytes, as for a release's digest. So it can be checked by hand (`printf %s sha256:… |
ssh-keygen -Y verify …`). The root names the keys and, per role (`root`, `index`), which sign and
how many must. The index names, per version, the release (an archive path or URL, or an image
reference), its digest, a rollout percentage, a not-before time and a revoked mark with its reason.

All of it is untrusted until `trust` checks the signatures. Parsing is bounded (document size,
string length, list count) and refuses what it does not know.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, NamedTuple

from ...errors import ChannelError, ReleaseError
from ...untrusted import control_character
from ..releases.pointers import check_version
from ..sha256 import hexdigest

NAMESPACE = "agent-fsm-channel"
ROOT_TYPE = "agent-fsm-channel-root"
INDEX_TYPE = "agent-fsm-channel-index"
MAX_DOCUMENT = 1 << 20  # bytes: an index of thousands of versions fits
MAX_TEXT = 4096  # characters of one string field (a URL, a reason, a key)
MAX_SIGNATURE = 16 << 10
MAX_RELEASES = 10_000
MAX_KEYS = 32
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}\Z")
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}\Z")
KEY_RE = re.compile(r"(ssh-ed25519|ecdsa-sha2-nistp(256|384|521)|ssh-rsa"
                    r"|sk-ssh-ed25519@openssh\.com|sk-ecdsa-sha2-nistp256@openssh\.com)"
                    r" [A-Za-z0-9+/=]{16,2048}\Z")


class Signature(NamedTuple):
    key: str  # the key's name in the root
    sig: str  # ssh-keygen's armored signature


class Envelope(NamedTuple):
    """A document as fetched: the canonical bytes that were signed, and the signatures."""

    signed: bytes
    body: Mapping[str, Any]
    signatures: tuple[Signature, ...]

    @property
    def message(self) -> str:
        """What each signature signs: `sha256:<hex>` of the canonical bytes."""
        return message(self.signed)


class Role(NamedTuple):
    keys: tuple[str, ...]
    threshold: int


class Root(NamedTuple):
    version: int
    expires: datetime
    keys: Mapping[str, str]  # name -> public key ("ssh-ed25519 AAAA...")
    roots: Role  # the keys that sign roots
    indexes: Role  # the keys that sign the index

    def to_json(self) -> dict[str, Any]:
        return {"type": ROOT_TYPE, "version": self.version, "expires": stamp(self.expires),
                "keys": dict(sorted(self.keys.items())),
                "roles": {"root": _role_json(self.roots), "index": _role_json(self.indexes)}}


class Entry(NamedTuple):
    """One version of the index."""

    version: str
    digest: str  # the release's digest, as `release add` prints it
    rollout: int  # percent of the nodes that may take it, 0-100
    archive: str | None = None  # a path under the channel's URL, or an https URL
    sha256: str | None = None  # the archive's own digest, checked before it is unpacked
    size: int | None = None  # the archive's bytes, the bound of its download
    image: str | None = None  # an image reference podman pulls (`docker://…`)
    not_before: datetime | None = None
    revoked: str | None = None  # why, when it is revoked

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": self.version, "digest": self.digest,
                               "rollout": self.rollout}
        for name in ("archive", "sha256", "size", "image", "revoked"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.not_before is not None:
            out["not_before"] = stamp(self.not_before)
        return out


class Index(NamedTuple):
    channel: str
    version: int  # only grows: a node refuses an index older than one it has seen
    expires: datetime
    releases: tuple[Entry, ...]

    def to_json(self) -> dict[str, Any]:
        return {"type": INDEX_TYPE, "channel": self.channel, "version": self.version,
                "expires": stamp(self.expires),
                "releases": [e.to_json() for e in self.releases]}

    def entry(self, version: str) -> Entry | None:
        return next((e for e in self.releases if e.version == version), None)


def canonical(body: Mapping[str, Any]) -> bytes:
    """The bytes a signature covers."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False).encode("utf-8")


def message(signed: bytes) -> str:
    return "sha256:" + hexdigest(signed)


def envelope(body: Mapping[str, Any], signatures: tuple[Signature, ...]) -> bytes:
    """A document as published: the envelope, one line, ending in a newline."""
    data = {"signed": body, "signatures": [{"key": s.key, "sig": s.sig} for s in signatures]}
    return canonical(data) + b"\n"


def stamp(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def read_envelope(data: bytes, what: str) -> Envelope:
    """The envelope in `data`; ChannelError naming `what` if it is not one."""
    if len(data) > MAX_DOCUMENT:
        raise ChannelError(f"{what} is larger than {MAX_DOCUMENT} bytes")
    try:
        top = json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicates,
                         parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise ChannelError(f"{what} is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(top, dict) or set(top) != {"signed", "signatures"}:
        raise ChannelError(f"{what} is not a signed document (keys `signed`, `signatures`)")
    body, sigs = top["signed"], top["signatures"]
    if not isinstance(body, dict) or not isinstance(sigs, list) or len(sigs) > MAX_KEYS:
        raise ChannelError(f"{what} is not a signed document")
    signatures = []
    for s in sigs:
        if not isinstance(s, dict) or set(s) != {"key", "sig"}:
            raise ChannelError(f"{what}: a signature is not {{key, sig}}")
        key, sig = _name(s["key"], f"{what}: a signature's key"), s["sig"]
        if not isinstance(sig, str) or len(sig) > MAX_SIGNATURE:
            raise ChannelError(f"{what}: the signature of {key} is not an armored signature")
        signatures.append(Signature(key, sig))
    try:
        signed = canonical(body)
    except ValueError:  # a lone surrogate has no UTF-8
        raise ChannelError(f"{what} holds text that is not UTF-8") from None
    return Envelope(signed, body, tuple(signatures))


def parse_root(body: Mapping[str, Any], what: str = "the channel's root") -> Root:
    _expect(body, ROOT_TYPE, {"type", "version", "expires", "keys", "roles"}, what)
    keys = body["keys"]
    if not isinstance(keys, dict) or not keys or len(keys) > MAX_KEYS:
        raise ChannelError(f"{what}: `keys` is not a table of 1-{MAX_KEYS} keys")
    for name, key in keys.items():
        _name(name, f"{what}: a key's name")
        if not isinstance(key, str) or not KEY_RE.fullmatch(key):
            raise ChannelError(f"{what}: key {name} is not an OpenSSH public key (TYPE BASE64)")
    roles = body["roles"]
    if not isinstance(roles, dict) or set(roles) != {"root", "index"}:
        raise ChannelError(f"{what}: `roles` must name `root` and `index`")
    return Root(_count(body["version"], f"{what}: `version`", low=1),
                _time(body["expires"], f"{what}: `expires`"), dict(keys),
                _role(roles["root"], keys, f"{what}: role root"),
                _role(roles["index"], keys, f"{what}: role index"))


def parse_index(body: Mapping[str, Any], what: str = "the channel's index") -> Index:
    _expect(body, INDEX_TYPE, {"type", "channel", "version", "expires", "releases"}, what)
    releases = body["releases"]
    if not isinstance(releases, list) or len(releases) > MAX_RELEASES:
        raise ChannelError(f"{what}: `releases` is not a list of at most {MAX_RELEASES}")
    entries = tuple(_entry(r, what) for r in releases)
    seen: set[str] = set()
    for e in entries:
        if e.version in seen:
            raise ChannelError(f"{what}: version {e.version} is listed twice")
        seen.add(e.version)
    return Index(_name(body["channel"], f"{what}: `channel`"),
                 _count(body["version"], f"{what}: `version`", low=1),
                 _time(body["expires"], f"{what}: `expires`"), entries)


_ENTRY_KEYS = {"version", "digest", "rollout", "archive", "sha256", "size", "image",
               "not_before", "revoked"}


def _entry(raw: object, what: str) -> Entry:
    if not isinstance(raw, dict) or not {"version", "digest", "rollout"} <= set(raw):
        raise ChannelError(f"{what}: a release lacks `version`, `digest` or `rollout`")
    unknown = set(raw) - _ENTRY_KEYS
    version = _text(raw["version"], f"{what}: a release's `version`")
    try:
        check_version(version)
    except ReleaseError as exc:
        raise ChannelError(f"{what}: {exc}") from None
    at = f"{what}: release {version}"
    if unknown:
        raise ChannelError(f"{at}: unknown key {sorted(unknown)[0]!r}")
    rollout = _count(raw["rollout"], f"{at}: `rollout`", low=0)
    if rollout > 100:
        raise ChannelError(f"{at}: `rollout` {rollout} is over 100")
    archive, image = raw.get("archive"), raw.get("image")
    if (archive is None) == (image is None):
        raise ChannelError(f"{at}: name exactly one of `archive` and `image`")
    entry = Entry(
        version, _digest(raw["digest"], f"{at}: `digest`"), rollout,
        archive=None if archive is None else _location(archive, f"{at}: `archive`"),
        sha256=None if raw.get("sha256") is None else _digest(raw["sha256"], f"{at}: `sha256`"),
        size=None if raw.get("size") is None else _count(raw["size"], f"{at}: `size`", low=0),
        image=None if image is None else _plain(image, f"{at}: `image`"),
        not_before=None if raw.get("not_before") is None
        else _time(raw["not_before"], f"{at}: `not_before`"),
        revoked=None if raw.get("revoked") is None else _text(raw["revoked"], f"{at}: `revoked`"))
    if archive is not None and (entry.sha256 is None or entry.size is None):
        raise ChannelError(f"{at}: an archive needs its `sha256` and `size`")
    return entry


def _expect(body: Mapping[str, Any], kind: str, keys: set[str], what: str) -> None:
    if body.get("type") != kind:
        raise ChannelError(f"{what} is not of type {kind}")
    if set(body) != keys:
        extra, missing = sorted(set(body) - keys), sorted(keys - set(body))
        raise ChannelError(f"{what}: " + (f"unknown key {extra[0]!r}" if extra
                                          else f"missing key {missing[0]!r}"))


def _role(raw: object, keys: Mapping[str, str], what: str) -> Role:
    if not isinstance(raw, dict) or set(raw) != {"keys", "threshold"}:
        raise ChannelError(f"{what} is not {{keys, threshold}}")
    names = raw["keys"]
    if not isinstance(names, list) or not names or len(set(map(str, names))) != len(names):
        raise ChannelError(f"{what}: `keys` is not a list of distinct key names")
    for name in names:
        if name not in keys:
            raise ChannelError(f"{what} names key {_name(name, what)}, which `keys` lacks")
    threshold = _count(raw["threshold"], f"{what}: `threshold`", low=1)
    if threshold > len(names):
        raise ChannelError(f"{what}: threshold {threshold} is more than its {len(names)} keys")
    return Role(tuple(names), threshold)


def _role_json(role: Role) -> dict[str, Any]:
    return {"keys": list(role.keys), "threshold": role.threshold}


def _text(value: object, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_TEXT:
        raise ChannelError(f"{what} is not a string of 1-{MAX_TEXT} characters")
    return value


def _plain(value: object, what: str) -> str:
    """A string that reaches a command line or a request: no space, no control character."""
    text = _text(value, what)
    if control_character(text) is not None or " " in text:
        raise ChannelError(f"{what} holds a space or a control character")
    return text


def _name(value: object, what: str) -> str:
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise ChannelError(f"{what} is not a name (letters, digits, '.', '_', '@', '+', '-')")
    return value


def _count(value: object, what: str, *, low: int) -> int:
    if type(value) is not int or not low <= value < 1 << 63:
        raise ChannelError(f"{what} is not a whole number of at least {low}")
    return value


def _digest(value: object, what: str) -> str:
    if not isinstance(value, str) or not DIGEST_RE.fullmatch(value):
        raise ChannelError(f"{what} is not sha256:<64 hex digits>")
    return value


def _time(value: object, what: str) -> datetime:
    if isinstance(value, str) and len(value) <= 40:
        try:
            when = datetime.fromisoformat(value)
        except ValueError:
            pass
        else:
            if when.tzinfo is not None:
                return when.astimezone(UTC)
    raise ChannelError(f"{what} is not a time such as 2027-01-31T00:00:00Z")


def _location(value: object, what: str) -> str:
    text = _plain(value, what)
    if text.startswith("https://"):
        return text
    parts = text.split("/")
    if "://" in text or text.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ChannelError(f"{what} is neither a path under the channel nor an https URL")
    return text


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")
