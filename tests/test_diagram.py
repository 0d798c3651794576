"""Diagrams: renderers on hand-built diagrams, and the committed page kept in step."""

from __future__ import annotations

from pathlib import Path

from agent_fsm import diagram
from agent_fsm.machine import load_definition

HAND = diagram.Diagram(
    name="m", initial="a",
    nodes=(diagram.Node("a", "the start"), diagram.Node("b", "the end")),
    edges=(diagram.Edge("go", "a", "b", ("gate_open",), ("write_assets?", "open_gate")),),
)
ROOT = Path(__file__).resolve().parent.parent


class TestRenderers:
    def test_mermaid_has_initial_edges_and_highlight(self) -> None:
        """Mermaid shows the initial arrow, each edge labelled by trigger, and the highlight."""
        text = diagram.mermaid(HAND, highlight="b")
        assert text.splitlines()[:3] == ["stateDiagram-v2", "    [*] --> a", "    a --> b: go"]
        assert "    class b current" in text

    def test_dot_marks_the_current_state(self) -> None:
        """Dot output has one edge per transition and fills only the highlighted node."""
        text = diagram.dot(HAND, highlight="a")
        assert 'a -> b [label="go"];' in text
        assert [line for line in text.splitlines() if "filled" in line] == [
            '    a [label="a", style="rounded,filled,bold", fillcolor="#ffd54f"];']

    def test_markdown_table_lists_effects_in_order(self) -> None:
        """The table row shows conditions and the effects in order, tolerant ones marked."""
        text = diagram.markdown(HAND)
        assert "| `go` | `a` | `b` | `gate_open` | `write_assets?` → `open_gate` |" in text
        assert "| `a` | the start |" in text


class TestCommittedPage:
    def test_committed_page_matches_definition(self) -> None:
        """diagrams/agent-upgrade.md is exactly what the definition generates."""
        page = (ROOT / "diagrams" / diagram.DIAGRAM_FILE).read_text()
        assert page == diagram.markdown(diagram.from_definition(load_definition()))

    def test_every_transition_appears_in_page(self) -> None:
        """Each trigger of the definition appears in the page's table."""
        page = diagram.markdown(diagram.from_definition(load_definition()))
        for t in load_definition().transitions:
            assert f"| `{t.trigger}` |" in page
