"""Diagrams: renderers on hand-built diagrams, the command's formats, the committed page."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agent_fsm.errors import AgentFsmError
from agent_fsm.upgrade.registry import load_definition
from agent_fsm.views import diagram
from tests.cli.test_cli import one_line_error, run
from tests.helpers import make_world

HAND = diagram.Diagram(
    name="m", initial="a",
    nodes=(diagram.Node("a", "the start"), diagram.Node("b", "the end")),
    edges=(diagram.Edge("go", "a", "b", ("gate_open",), ("write_assets?", "restart_unit*"),
                        by=("operator", "recovery")),),
)
ROOT = Path(__file__).resolve().parents[2]


class TestRenderers:
    def test_mermaid_has_initial_edges_and_highlight(self) -> None:
        """Mermaid shows the initial arrow, each edge labelled by trigger, and the highlight."""
        text = diagram.mermaid(HAND, highlight="b")
        assert text.splitlines()[:3] == ["stateDiagram-v2", "    [*] --> a", "    a --> b: go"]
        assert "    class b current" in text

    def test_dot_marks_the_current_state(self) -> None:
        """Dot output has one edge per transition and fills only the highlighted node."""
        text = diagram.dot(HAND, highlight="a")
        assert 'a -> b [label="go", tooltip="if gate_open; write_assets? -> restart_unit*"];' in text
        assert [line for line in text.splitlines() if "filled" in line] == [
            '    a [label="a", tooltip="the start", style="rounded,filled,bold", '
            'fillcolor="#ffd54f"];']

    def test_dot_quotes_descriptions(self) -> None:
        """A description with quotes or backslashes stays one valid dot string."""
        odd = diagram.Diagram("m", "a", (diagram.Node("a", 'say "hi" \\ bye'),), ())
        assert '    a [label="a", tooltip="say \\"hi\\" \\\\ bye"];' in diagram.dot(odd)

    def test_markdown_table_lists_effects_in_order(self) -> None:
        """The table row shows the roles that may fire it, conditions and the effects in order,
        tolerant ones and those done at the unit's own start marked."""
        text = diagram.markdown(HAND)
        assert ("| `go` | `operator`, `recovery` | `a` | `b` | `gate_open` | `write_assets?` → "
                "`restart_unit*` |") in text
        assert "| `a` | the start |" in text

    def test_markdown_states_show_what_a_start_and_recover_do(self) -> None:
        """Each state's row gives its start and recover behaviour, each name explained below."""
        hand = diagram.Diagram("m", "a", (diagram.Node("a", "the start", "judge_candidate",
                                                       "roll_back"),), (),
                               actions=(("judge_candidate", "judge it"),))
        text = diagram.markdown(hand)
        assert "| `a` | the start | `judge_candidate` | `roll_back` |" in text
        assert "| `judge_candidate` | judge it |" in text
        assert "| `a` | the start | — | — |" in diagram.markdown(HAND)


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

    def test_the_page_shows_every_states_start_and_recover(self) -> None:
        """The generated page names, for each state of the definition, what a daemon start and
        `recover` do there."""
        page = diagram.markdown(diagram.from_definition(load_definition()))
        for s in load_definition().states:
            assert f"| `{s.name}` | {s.description} | `{s.on_start}` | `{s.on_recover}` |" in page


FAKE_DOT = """#!/bin/sh
# A stand-in for graphviz (shell builtins only): records its argv, answers with an SVG that
# embeds its input.
echo "$@" > "${0}.argv"
printf '<svg xmlns="http://www.w3.org/2000/svg"><!--\\n'
while IFS= read -r line; do printf '%s\\n' "$line"; done
printf -- '--></svg>\\n'
"""


def path_with(tmp_path: Path, dot: str | None) -> dict[str, str]:
    """A PATH that has only the interpreter's directory and, if given, a `dot` script."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    if dot is not None:
        (bindir / "dot").write_text(dot)
        (bindir / "dot").chmod(0o755)
    return {"PATH": str(bindir)}


class TestFormats:
    def test_mermaid_is_the_default(self) -> None:
        """`agent-fsm diagram` prints the mermaid state diagram."""
        proc = run("diagram")
        assert proc.returncode == 0
        assert proc.stdout.startswith("stateDiagram-v2\n    [*] --> idle\n")

    def test_dot(self) -> None:
        """--format dot prints a digraph with every transition."""
        proc = run("diagram", "--format", "dot")
        assert proc.stdout.startswith('digraph "agent-upgrade" {')
        assert 'judged_ok -> converged [label="complete"' in proc.stdout

    def test_svg_through_graphviz(self, tmp_path: Path) -> None:
        """--format svg pipes the dot text through `dot -Tsvg` and prints the SVG."""
        proc = run("diagram", "--format", "svg", env=path_with(tmp_path, FAKE_DOT))
        assert proc.returncode == 0, proc.stderr
        assert (tmp_path / "bin" / "dot.argv").read_text().strip() == "-Tsvg"
        assert proc.stdout.startswith("<svg") and 'digraph "agent-upgrade"' in proc.stdout

    def test_svg_without_graphviz_is_one_clear_line(self, tmp_path: Path) -> None:
        """Without graphviz, --format svg exits 1 with one line saying what to install."""
        proc = run("diagram", "--format", "svg", env=path_with(tmp_path, None))
        assert proc.returncode == 1
        line = one_line_error(proc)
        assert "graphviz is not installed" in line and "--format dot" in line
        assert proc.stdout == ""

    def test_failing_graphviz_is_one_line(self, tmp_path: Path) -> None:
        """A graphviz that fails is reported with its last line of stderr, exit 1."""
        broken = "#!/bin/sh\necho 'Error: syntax error in line 3' >&2\nexit 1\n"
        proc = run("diagram", "--format", "svg", env=path_with(tmp_path, broken))
        assert proc.returncode == 1
        assert "exited 1: Error: syntax error in line 3" in one_line_error(proc)

    @pytest.mark.skipif(shutil.which("dot") is None,
                        reason="graphviz is not installed here; the fake `dot` tests cover the "
                        "command, this one checks graphviz accepts our dot")
    def test_real_graphviz_accepts_our_dot(self) -> None:
        """Real graphviz renders the machine to an SVG naming every state."""
        svg = diagram.svg(diagram.from_definition(load_definition()), highlight="recovering")
        assert "<svg" in svg
        for state in load_definition().state_names:
            assert state in svg

    def test_svg_error_in_process(self) -> None:
        """svg() raises an AgentFsmError naming the missing executable."""
        with pytest.raises(AgentFsmError, match="no-such-dot"):
            diagram.svg(HAND, executable="no-such-dot")

    def test_output_file_and_current_state(self, tmp_path: Path) -> None:
        """--current --output FILE writes the diagram with the node's state highlighted."""
        world = make_world(tmp_path / "root")
        world.installed("1.0.0").upgrading("2.0.0")
        cfg = tmp_path / "config.toml"
        cfg.write_text('name = "agent"\n')
        target = tmp_path / "out" / "machine.mmd"
        proc = run("--config", str(cfg), "--root", str(world.root), "diagram", "--current",
                   "--output", str(target))
        assert proc.returncode == 0, proc.stderr
        assert "    class candidate_running current" in target.read_text()
        assert proc.stdout == ""

    def test_unknown_format_is_usage(self) -> None:
        """An unknown --format is a usage error (exit 2) listing the formats."""
        proc = run("diagram", "--format", "png")
        assert proc.returncode == 2
        assert "mermaid" in proc.stderr and "svg" in proc.stderr
