"""docs/reliability.md quotes the crash and power-loss counts the suite really covers, and every
test it names (`file.py::Class::test[param]`) exists.

The figures are computed the way the suite enumerates its points (the crash tests' `POINTS`, the
power-loss tests' file operations counted by a dry run of each transition), not by rerunning
those suites.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import copy_tree, make_world
from tests.machine.test_machine import _args, _to
from tests.reliability import test_crash, test_crash_points, test_power_loss
from tests.reliability.powerloss import PowerLoss

ROOT = Path(__file__).resolve().parents[2]
DOC_PATH = "docs/reliability.md"
DOC = (ROOT / DOC_PATH).read_text(encoding="utf-8")
# A test named in the doc: a path ending in .py, then `::` and the rest of the node id.
NAMED_TEST = re.compile(r"[\w./-]+\.py::[^\s`|)]+")

Count = Callable[[Path, pytest.MonkeyPatch], int]


def _single_transition_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """test_power_loss_at_every_operation: one point before each file operation of each run,
    and one after the last."""
    return sum(test_power_loss._count_ops(tmp_path / str(i), trigger, source, monkeypatch, config) + 1
               for i, (trigger, source, config) in enumerate(test_power_loss.RUNS))


def _cycle_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """test_power_loss_across_an_upgrade_cycle: its set-up and counting run (the first CUT
    transitions of the cycle), plus one point after the last operation."""
    prepared = make_world(tmp_path / "prepared")
    _to("converged")(prepared)
    args = {t: _args(t, prepared) for t in test_power_loss.CYCLE}
    copy_tree(prepared.root, tmp_path / "count")
    counting = make_world(tmp_path / "count")
    layer = PowerLoss(counting.root)
    with pytest.MonkeyPatch.context() as mp:
        layer.install(mp)
        test_power_loss._cycle(counting, args, 0, test_power_loss.CUT)
    return layer.ops + 1


# (row of the doc's first table, the text quoting the count with {} for it, the real count)
CLAIMS: list[tuple[str, str, Count]] = [
    ("Crash at every point", "**{} points**", lambda _t, _m: len(test_crash_points.POINTS)),
    ("Crash at every point", "of all {} transitions",
     lambda _t, _m: len(test_crash_points.DEFINITION.transitions)),
    ("Crash between effects, in process", "{} points", lambda _t, _m: len(test_crash.POINTS)),
    ("Power loss", "**{} points** (every write", _single_transition_points),
    ("Power loss", "**{} points** across an upgrade cycle", _cycle_points),
]


def _cell(row: str) -> str:
    """The count cell (third column) of the table row whose first cell is `row`."""
    for line in DOC.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0] == row:
            return cells[2]
    raise AssertionError(f"{DOC_PATH} has no table row {row!r}: update CLAIMS in {__file__}")


class TestCounts:
    @pytest.mark.parametrize(("row", "quote", "count"), CLAIMS,
                             ids=[f"{row}: {quote}" for row, quote, _ in CLAIMS])
    def test_the_doc_quotes_the_real_count(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           row: str, quote: str, count: Count) -> None:
        """Each crash and power-loss count the doc quotes is the number of points the suite
        covers, and a stale one names the text to change."""
        cell = _cell(row)
        before, after = quote.split("{}")
        found = re.search(re.escape(before) + r"(\d+)" + re.escape(after), cell)
        assert found, f"{DOC_PATH}, row {row!r}: no {quote.format('N')!r} in {cell!r}"
        real = count(tmp_path, monkeypatch)
        assert int(found.group(1)) == real, (
            f"{DOC_PATH}, row {row!r}: change {found.group(0)!r} to {quote.format(real)!r} "
            f"(the suite covers {real})")

    def test_the_power_loss_row_names_the_transitions_run(self) -> None:
        """The power-loss row names exactly the transitions the power-loss suite cuts the power in."""
        single = _cell("Power loss").split("across an upgrade cycle")[0]
        named = set(re.findall(r"`(\w+)`", single))
        run = {trigger for trigger, _ in test_power_loss.CASES}
        assert named == run, (f"{DOC_PATH}, row 'Power loss': names {sorted(named)}; the suite runs "
                              f"{sorted(run)} (tests/reliability/test_power_loss.py CASES)")


def _collected(files: set[str]) -> list[str]:
    """The node ids pytest collects from `files`, parametrized ones included."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly",
         "-p", "no:cacheprovider", *sorted(files)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return [line for line in proc.stdout.splitlines() if "::" in line]


def _full(named: str) -> str:
    """A node id as the doc writes it, from the repository root (the doc leaves out `tests/`)."""
    return named if (ROOT / named.split("::")[0]).is_file() else f"tests/{named}"


class TestNamedTests:
    def test_every_test_the_doc_names_exists(self) -> None:
        """Every `file.py::Class::test[param]` the doc names is a test pytest collects; a renamed
        or moved one is reported with what it is called now."""
        named = {n: _full(n) for n in NAMED_TEST.findall(DOC)}
        assert len(named) >= 5, f"{NAMED_TEST.pattern} finds almost no test in {DOC_PATH}: {named}"
        missing = [n for n in named.values() if not (ROOT / n.split("::")[0]).is_file()]
        assert not missing, f"{DOC_PATH} names tests in files that do not exist: {missing}"
        ids = _collected({n.split("::")[0] for n in named.values()})
        wrong = []
        for written, node in sorted(named.items()):
            if any(i == node or i.startswith((node + "::", node + "[")) for i in ids):
                continue
            last = node.split("::")[-1]
            now = [i.removeprefix(node.removesuffix(written)) for i in ids
                   if i.split("::")[0] == node.split("::")[0] and i.split("::")[-1] == last]
            wrong.append(f"{written} (now: {', '.join(now)})" if now else written)
        assert not wrong, f"{DOC_PATH} names tests pytest does not collect: {'; '.join(wrong)}"
