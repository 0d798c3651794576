"""Text agent-fsm did not write (a release's manifest, a check's answer, a command's output, a
file's content or name), as people are shown it.

`shown` is the one way such text reaches a terminal, the journal or systemd's status line. It writes
every control character visibly, as `\\n`, `\\r`, `\\t`, `\\xNN`, `\\uNNNN` or `\\UNNNNNNNN`: C0 and
C1 controls, DEL, format characters that reorder or hide text (bidi overrides, zero-width ones),
lone surrogates of undecodable bytes, line and paragraph separators. It cuts the whole to a bound,
ending in "…". `quoted` does the same inside double quotes and escapes `"` and `\\`, so quoted text
cannot close the quote and speak in agent-fsm's voice.

JSON output uses neither: `json.dumps` escapes control characters, and a program reading JSON gets
the exact value.
"""

from __future__ import annotations

import unicodedata

# Control, format (bidi overrides, zero-width), surrogate, line and paragraph separators.
_CONTROL_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
MAX_SHOWN = 200  # characters of one untrusted value in a human view, unless its caller says
MAX_LINE = 1000  # characters of one message of agent-fsm's that quotes such values (an error)
CUT = "…"


def is_control(ch: str) -> bool:
    """Whether the character `ch` is one `shown` writes as an escape."""
    return unicodedata.category(ch) in _CONTROL_CATEGORIES


def control_character(value: str) -> str | None:
    """The first control character of `value` as `U+XXXX`, or None."""
    for ch in value:
        if is_control(ch):
            return f"U+{ord(ch):04X}"
    return None


_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(ch: str) -> str:
    if ch in _SHORT:
        return _SHORT[ch]
    n = ord(ch)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def _visible(text: str, limit: int | None, keep: str, also: str) -> str:
    pieces: list[str] = []
    size = within = 0  # characters so far; pieces that leave room for the cut mark
    room = 0 if limit is None else limit - len(CUT)
    for ch in text:  # stops past `limit`: an enormous text costs no more than a short one
        piece = _escape(ch) if is_control(ch) and ch not in keep else (
            "\\" + ch if ch in also else ch)
        size += len(piece)
        if limit is not None and size > limit:
            return "".join(pieces[:within]) + CUT
        pieces.append(piece)
        if size <= room:
            within = len(pieces)
    return "".join(pieces)


def shown(value: object, limit: int | None = MAX_SHOWN, *, keep: str = "") -> str:
    """`value` as text for people: control characters visible (those in `keep` left as they are), at
    most `limit` characters (None: no bound), a cut one ending in "…"."""
    return _visible(str(value), limit, keep, "")


def quoted(value: object, limit: int | None = MAX_SHOWN) -> str:
    """`value` in double quotes, written as `shown` writes it, with `"` and `\\` escaped. At most
    `limit` characters between the quotes."""
    return f'"{_visible(str(value), limit, "", chr(34) + chr(92))}"'
