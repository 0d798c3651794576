"""The placeholders of a release's `workload` command: `{release_dir}`, `{payload_dir}`,
`{version}`, anywhere in a word. agent-fsm expands them, never a shell, when the daemon starts the
workload. `{{` and `}}` are literal braces. `check` refuses any other `{...}` or a lone brace
wherever a release is made or read (`release pack`, `release add`, every manifest read). Its one
line names the word and what to write instead."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ...errors import ReleaseError

PLACEHOLDERS = ("release_dir", "payload_dir", "version")
_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")


def _expand_word(word: str, values: Mapping[str, str] | None) -> str:
    """`word` with its placeholders replaced by `values` (None: only checked); ValueError names what
    is wrong."""
    out: list[str] = []
    at = 0
    for found in _TOKEN.finditer(word):
        out.append(word[at:found.start()])
        at = found.end()
        token = found.group(0)
        if token in ("{{", "}}"):
            out.append(token[0])
        elif token in ("{", "}"):
            raise ValueError(f"a lone {token!r} at character {found.start() + 1}")
        else:
            name = found.group(1)
            if name not in PLACEHOLDERS:
                raise ValueError(f"unknown placeholder {token}")
            out.append(token if values is None else values[name])
    out.append(word[at:])
    return "".join(out)


def _refused(where: str, i: int, word: str, why: str) -> ReleaseError:
    known = ", ".join("{" + p + "}" for p in PLACEHOLDERS)
    shown = repr(word) if len(word) <= 60 else repr(word[:57]) + "..."
    return ReleaseError(f"{where}: workload word {i} ({shown}) has {why}; known placeholders: "
                        f"{known}; write a literal brace as {{{{ or }}}}")


def check(argv: Sequence[str], where: str) -> None:
    """Refuse a workload with an unknown placeholder or a lone brace (ReleaseError, one line, naming
    `where`: the manifest or the command given it)."""
    for i, word in enumerate(argv):
        try:
            _expand_word(word, None)
        except ValueError as exc:
            raise _refused(where, i, word, str(exc)) from None


def expand(argv: Sequence[str], *, release_dir: str, payload_dir: str,
           version: str) -> tuple[str, ...]:
    """The command the daemon runs, each word's placeholders replaced; an unchecked argv raises
    ReleaseError as `check` does."""
    values = {"release_dir": release_dir, "payload_dir": payload_dir, "version": version}
    out = []
    for i, word in enumerate(argv):
        try:
            out.append(_expand_word(word, values))
        except ValueError as exc:
            raise _refused(f"release {version}", i, word, str(exc)) from None
    return tuple(out)
