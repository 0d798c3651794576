"""The one format of every file in the state dir, and the rules for reading one.

A file is a document: its body plus `kind` (which file), `schema` (the body's layout) and `checksum`
("sha256:" and the SHA-256 of the canonical JSON of everything else: sorted keys, no spaces). The
file is that canonical JSON with the checksum inserted; "checksum" sorts first, so a reader checks
the bytes after it as they are. The same body always gives the same bytes.

A `Kind` declares one file: name, schema, words for messages, mode, read limit and `check`. A reader
checks, in order: JSON object, a schema it reads (directly or through the core), checksum, kind,
every field. A newer file without a core is refused before its checksum, which a later release may
compute otherwise. A refused file (`DocumentError`, one line) is left untouched; what follows is the
reader's choice. A changed body is a new schema, except for an added optional key whose absence
keeps the old meaning, which every reader since 0.1.0 keeps unread and nothing on the way back
needs: that is the same schema (docs/state-files.md lists each such key).

Forward compatibility: a later agent-fsm that changes a body bumps `schema` and may declare `core`,
the oldest schema whose readers can still read the file. A reader of schema R reads a file of schema
S > R with core C <= R as schema R. The writer promises (docs/state-files.md):

- This layout (JSON object, `kind`, `schema`, `core`, checksum). Another is damage.
- Every field of each schema from C to S keeps its type, range and meaning. New schemas only add
  keys.
- A reader keeps unknown keys on rewrite and writes its own schema. A later reader of an older
  schema trusts that schema's fields, and takes its own later keys as possibly stale.

| file in the state dir                    | kind            | schema |
| ---------------------------------------- | --------------- | ------ |
| `state.json` (`store`)                   | `state`         | 2      |
| `upgrade-signal.json` (`signal`)         | `signal`        | 1      |
| `hold.json` (`hold`)                     | `hold`          | 1      |
| `known-bad.json` (`known_bad`)           | `known-bad`     | 1      |
| `known-good.json` (`known_good`)         | `known-good`    | 1      |
| `hook-failures.json` (`hook_failures`)   | `hook-failures` | 1      |
| `last-good-assets.json` (`kept`)         | `kept-assets`   | 1      |
| `systemd.json` (`assets.render`)         | `systemd`       | 1      |
| `results/*.json`, `outbox/*.json`        | `result`        | 1      |
| `releases/.images/<version>` (`origins`) | `image-record`  | 1      |
| `channel/follow.json` (`channel.record`) | `channel`       | 1      |

Not documents: the history journal, the release store's text files, the locks, and the `selected`
and `last-good` symlinks.
"""

from __future__ import annotations

import json
import reprlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TypeGuard

from ... import files
from ...errors import DocumentError
from ..sha256 import hexdigest

Check = Callable[[dict[str, Any], int], object]  # a body and the schema it was read at


class Problem(ValueError):
    """What is wrong with a file's bytes ("is empty") or one of its fields (`field`), in one phrase."""

    def __init__(self, why: str, *, field: bool = False, newer: bool = False) -> None:
        super().__init__(why)
        self.why = why
        self.detail = f"{': ' if field else ' '}{why}"  # what follows the file's name
        self.newer = newer


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80  # a checksum whole; anything longer cut to one line


def _shown(value: Any) -> str:
    return _REPR.repr(value)


def parse(raw: bytes) -> Any:
    """JSON from a file's bytes; Problem ("is empty", "is not valid JSON") if it is not."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise Problem("is empty" if not raw.strip() else "is not valid JSON") from None


def _integer(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _canonical(data: dict[str, Any], ascii: bool = True) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=ascii).encode()


def checksum(data: dict[str, Any]) -> str:
    """The checksum of a document's other keys (its body, kind and schema)."""
    return "sha256:" + hexdigest(_canonical(data))


_PREFIX = b'{"checksum":"sha256:'
_HEX = 64


def _verify_canonical(raw: bytes) -> bool | None:
    """Whether the checksum of canonical `raw` is right; None when `raw` is laid out otherwise."""
    head = len(_PREFIX) + _HEX
    if not raw.startswith(_PREFIX) or raw[head:head + 2] != b'",':
        return None
    return hexdigest(b"{" + raw[head + 2:].rstrip(b"\n")).encode() == raw[len(_PREFIX):head]


class Kind(NamedTuple):
    """One kind of file in the state dir, and its rules."""

    name: str  # its `kind` key
    title: str  # how a message names a file of it: "hold file"
    noun: str  # how a message names its body: "the hold"
    schema: int  # the schema written
    check: Check  # every field of a body; ValueError (`errors.Invalid`) naming the field
    limit: int  # the most bytes read
    mode: int  # the mode written
    # Non-ASCII written as UTF-8, not as \u escapes. Every reader checks the bytes as they are.
    utf8: bool = False

    def encode(self, body: dict[str, Any]) -> bytes:
        """The document of `body` (which holds none of `kind`, `schema`, `checksum`)."""
        canonical = _canonical({**body, "kind": self.name, "schema": self.schema},
                               ascii=not self.utf8)
        return _PREFIX + hexdigest(canonical).encode() + b'",' + canonical[1:] + b"\n"

    def body(self, raw: bytes, check: Check | None = None) -> dict[str, Any]:
        """The body of a file's bytes, every field checked by `check` or the kind's; Problem if not."""
        data = parse(raw)
        if not isinstance(data, dict):
            raise Problem(f"is not a JSON object ({self.noun} is {_shown(data)})")
        if "kind" not in data:
            raise Problem(f"has no kind, expected {self.name!r}")
        schema = data.get("schema")
        if not _integer(schema) or schema < self.schema:
            raise Problem(f"has schema {_shown(schema)}, expected {self.schema}")
        read_as = schema
        if schema > self.schema:  # readable here only through a core this reader knows
            core = data.get("core", schema)
            if not _integer(core) or not 1 <= core <= self.schema:
                told = f", and core {_shown(core)} is not one it reads" if "core" in data else ""
                raise Problem(f"has schema {schema}, newer than this agent-fsm understands "
                              f"({self.schema}){told}", newer=True)
            read_as = self.schema
        elif "core" in data and (not _integer(data["core"]) or data["core"] > schema):
            raise Problem(f"has core {_shown(data['core'])}, expected a schema up to its own "
                          f"({schema})")
        stored = data.pop("checksum", None)
        if stored is None:
            raise Problem(f"has no checksum, expected {checksum(data)!r}")
        if not _verify_canonical(raw):
            expected = checksum(data)
            if stored != expected:
                raise Problem(f"has checksum {_shown(stored)}, expected {expected!r}")
        data.pop("schema", None)
        data.pop("core", None)
        found = data.pop("kind")
        if found != self.name:
            raise Problem(f"kind is {_shown(found)}, expected {self.name!r}", field=True)
        try:
            (check or self.check)(data, read_as)
        except ValueError as exc:  # errors.Invalid among them
            raise Problem(str(exc), field=True) from None
        return data

    def refused(self, path: Path, problem: Problem) -> DocumentError:
        todo = "run the newer agent-fsm that wrote it" if problem.newer else \
            "run `agent-fsm doctor`"
        return DocumentError(f"{self.title} {path}{problem.detail}; it was left untouched; "
                             f"{todo}", problem.detail)

    def decode(self, raw: bytes, path: Path, check: Check | None = None) -> dict[str, Any]:
        """The body of `path`'s bytes; DocumentError, naming the file, if it is refused."""
        try:
            return self.body(raw, check)
        except Problem as problem:
            raise self.refused(path, problem) from None

    def read(self, path: Path, check: Check | None = None) -> dict[str, Any] | None:
        """The body of the file, or None when there is none; DocumentError when it is refused."""
        try:
            raw = files.read_regular(path, self.limit)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise self.refused(path, Problem(f"cannot be read: {why}")) from None
        return self.decode(raw, path, check)

    def write(self, path: Path, body: dict[str, Any], mode: int | None = None) -> None:
        """Replace the file atomically with the document of `body`; OSError or UnsafePath."""
        files.atomic_write(path, self.encode(body), self.mode if mode is None else mode)
