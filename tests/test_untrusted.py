"""`untrusted.shown` and `quoted`: how text agent-fsm did not write is shown to people."""

from __future__ import annotations

import pytest

from agent_fsm.untrusted import quoted, shown

pytestmark = pytest.mark.timeout(10)


class TestShown:
    def test_control_characters_are_written_visibly(self) -> None:
        """ESC, BEL, CR, LF, TAB, backspace, DEL, C1, a bidi override, a zero-width space and
        an undecodable byte's surrogate are each written as an escape; other text is kept."""
        assert shown("a\x1b]0;t\x07\r\n\t\x08\x7f\x9b\u202e\u200b\udcff é [b]") == (
            r"a\x1b]0;t\x07\r\n\t\x08\x7f\x9b\u202e\u200b\udcff é [b]")

    def test_cut_to_its_bound_ending_in_an_ellipsis(self) -> None:
        """A text over the bound is cut to exactly the bound, never inside an escape."""
        assert shown("abcdefghij", 10) == "abcdefghij"
        assert shown("abcdefghijk", 10) == "abcdefghi…"
        assert shown("ab\x1b" * 5, 10) == r"ab\x1b" + "ab…"
        assert len(shown("x" * 10_000_000)) == 200

    def test_kept_characters_pass(self) -> None:
        """Characters the caller keeps (a console's line breaks) are left as they are."""
        assert shown("a\nb\x1b", None, keep="\n") == "a\nb\\x1b"


class TestQuoted:
    def test_a_quote_inside_cannot_close_the_quote(self) -> None:
        """`"` and `\\` inside are escaped, so the quoted words end only at the last quote."""
        assert quoted('x", not followed) \\ ok\n') == r'"x\", not followed) \\ ok\n"'

    def test_bounded_between_the_quotes(self) -> None:
        """The bound counts what is between the quotes."""
        assert quoted("y" * 50, 10) == '"' + "y" * 9 + '…"'
