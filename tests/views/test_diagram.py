"""Diagrams: renderers on hand-built diagrams, the command's formats, the committed page."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
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


def page_copy(tmp_path: Path, edit: Callable[[bytes], bytes] = lambda b: b) -> Path:
    """A directory holding the committed page, passed through `edit`."""
    directory = tmp_path / "diagrams"
    directory.mkdir()
    (directory / diagram.DIAGRAM_FILE).write_bytes(
        edit((ROOT / "diagrams" / diagram.DIAGRAM_FILE).read_bytes()))
    return directory


def fork(tmp_path: Path) -> Path:
    """A fork's checkout: the package, states/ with one state described otherwise, and the
    diagram page it rendered from that (as `make diagram` there writes it)."""
    tree = tmp_path / "fork"
    for name in ("agent_fsm", "states", "diagrams"):
        shutil.copytree(ROOT / name, tree / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    states = tree / "states" / "agent-upgrade.toml"
    text = states.read_text()
    assert "Not installed yet" in text
    states.write_text(text.replace("Not installed yet", "Our agent is not installed yet"))
    written = run("diagram", "--format", "markdown", "--output", "diagrams/agent-upgrade.md",
                  cwd=tree)
    assert written.returncode == 0, written.stderr
    return tree


class TestPageCheck:
    def test_the_committed_page_passes(self) -> None:
        """`agent-fsm diagram --check` in the checkout's root exits 0, prints no diagram and says
        the page matches."""
        proc = run("diagram", "--check")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == ""
        assert proc.stderr == "diagrams/agent-upgrade.md matches the machine definition\n"

    def test_a_page_one_byte_off_fails_naming_the_file_and_the_rewrite(self, tmp_path: Path) -> None:
        """A page with one byte changed exits 1 with one line naming that page, the line where it
        differs and the commands that rewrite it."""
        lines = (ROOT / "diagrams" / diagram.DIAGRAM_FILE).read_bytes().split(b"\n")
        at = next(n for n, line in enumerate(lines) if line.startswith(b"| `idle` |"))
        lines[at] = lines[at].replace(b"`idle`", b"`Idle`")
        directory = page_copy(tmp_path, lambda _: b"\n".join(lines))
        proc = run("diagram", "--check", "--dir", str(directory))
        assert proc.returncode == 1
        line = one_line_error(proc)
        page = directory / diagram.DIAGRAM_FILE
        assert line.startswith(f"agent-fsm: {page} differs from what the machine's definition "
                               f"renders (from line {at + 1}): ")
        assert "`make diagram`" in line
        assert f"`agent-fsm diagram --format markdown --output {page}`" in line

    def test_a_page_that_only_grew_fails(self, tmp_path: Path) -> None:
        """A page with one line added at its end exits 1: the rendered page is a prefix of it."""
        directory = page_copy(tmp_path, lambda page: page + b"an extra line\n")
        proc = run("diagram", "--check", "--dir", str(directory))
        assert proc.returncode == 1
        assert "is larger than" in one_line_error(proc)

    def test_a_huge_page_is_not_read(self, tmp_path: Path) -> None:
        """A page of 1 TiB (sparse) exits 1 at once, saying it is too large, without reading it."""
        directory = tmp_path / "diagrams"
        directory.mkdir()
        with (directory / diagram.DIAGRAM_FILE).open("wb") as huge:
            huge.truncate(1 << 40)
        proc = run("diagram", "--check", "--dir", str(directory))
        assert proc.returncode == 1
        assert "is larger than" in one_line_error(proc)

    def test_a_missing_directory_is_one_clear_line(self, tmp_path: Path) -> None:
        """Run outside a checkout (no diagrams/ here), --check exits 1 with one line saying the
        directory does not exist and how to name it."""
        proc = run("diagram", "--check", cwd=tmp_path)
        assert proc.returncode == 1
        assert one_line_error(proc) == (
            f"agent-fsm: no diagram page to check: {tmp_path / 'diagrams'} does not exist; run from the "
            "checkout's root (which holds diagrams/) or name the directory with --dir")

    def test_a_missing_page_is_one_clear_line(self, tmp_path: Path) -> None:
        """A directory without the page exits 1 with one line naming the page to write."""
        (tmp_path / "diagrams").mkdir()
        proc = run("diagram", "--check", cwd=tmp_path)
        assert proc.returncode == 1
        line = one_line_error(proc)
        assert line.startswith("agent-fsm: no diagram page diagrams/agent-upgrade.md: run "
                               "`make diagram`")

    def test_a_forks_page_is_checked_against_the_forks_definition(self, tmp_path: Path) -> None:
        """A fork's CI, in its checkout's root, passes on the page its definition renders; that
        page fails against this checkout's definition (`--dir` on the fork's copy), and this
        checkout's page fails against the fork's."""
        tree = fork(tmp_path)
        assert run("diagram", "--check", cwd=tree).returncode == 0
        theirs = run("diagram", "--check", "--dir", str(tree / "diagrams"))
        assert theirs.returncode == 1
        assert f"{tree / 'diagrams' / diagram.DIAGRAM_FILE} differs" in one_line_error(theirs)
        ours = run("diagram", "--check", "--dir", str(ROOT / "diagrams"), cwd=tree)
        assert ours.returncode == 1
        assert "differs" in one_line_error(ours)

    def test_the_labs_check_is_the_same(self, tmp_path: Path) -> None:
        """`python -m agent_fsm_lab diagram` (what `make lint` runs) passes on the committed page
        and fails on a changed one with the same line as `agent-fsm diagram --check`."""
        def lab(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "agent_fsm_lab", "diagram", *args],
                                  capture_output=True, text=True, check=False, cwd=ROOT,
                                  timeout=60)

        assert lab().returncode == 0
        directory = page_copy(tmp_path, lambda page: page.replace(b"idle", b"idel", 1))
        labs, ours = lab("--dir", str(directory)), run("diagram", "--check", "--dir", str(directory))
        assert (labs.returncode, ours.returncode) == (1, 1)
        assert one_line_error(labs) == one_line_error(ours)

    def test_check_ignores_the_printing_options_as_0_1_0_did(self, tmp_path: Path) -> None:
        """`--check` with --format, --output or --current checks the page and prints or writes no
        diagram, as 0.1.0 did for the scripts written against it."""
        output = tmp_path / "machine.dot"
        proc = run("diagram", "--check", "--format", "dot", "--current", "--output", str(output))
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == "" and not output.exists()
        assert proc.stderr.endswith("matches the machine definition\n")

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
