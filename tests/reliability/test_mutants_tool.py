"""The mutation gate (agent_fsm_lab/mutants.py) counts a variant as killed only when a test really fails
on it and passes, rerun once, on the unmutated tree: a timeout is "timeout", a test failing on the
unmutated tree too is "flaky", and the report names both.

The variants run for real, through real pytest processes, against a tiny tree standing in for the
project's snapshot: its one test file reacts to the definition's text as the suite would to a
variant.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from agent_fsm_lab import mutants

ROOT = Path(__file__).resolve().parents[2]



# What each test does with the definition's text (the unmutated one is "baseline"); TINY=broken
# in the environment breaks a test on every tree, as a flaky or broken test would.
TINY_TESTS = '''
import os
import threading
import time
from pathlib import Path

import pytest

TEXT = (Path(__file__).parent.parent / "states" / "agent-upgrade.toml").read_text()


def test_the_definition():
    assert os.environ.get("TINY") != "broken", "fails on every tree"
    if TEXT == "fail-then-hang":  # a thread left running: pytest reports, then never exits
        threading.Thread(target=time.sleep, args=(60,)).start()
    assert TEXT in ("baseline", "hang", "stall"), "the variant is seen"


def test_hang():
    if TEXT == "hang":
        time.sleep(60)  # pytest-timeout fails it (timeout = 1 below)


@pytest.mark.timeout(0)
def test_stall():
    if TEXT == "stall":
        time.sleep(60)  # only the gate's own deadline stops it
'''


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A scratch directory whose snapshot is the tiny tree: an importable agent_fsm and a lab
    whose `diagram --write` does nothing, a definition, and the tests above."""
    snapshot = tmp_path / "snapshot"
    for rel, text in {
        "agent_fsm/__init__.py": "",
        "agent_fsm/__main__.py": "",
        "agent_fsm_lab/__init__.py": "",
        "agent_fsm_lab/__main__.py": "",
        "states/agent-upgrade.toml": "baseline",
        "pytest.ini": "[pytest]\ntimeout = 1\naddopts = -p no:randomly\n",
        "tests/test_tiny.py": TINY_TESTS,
    }.items():
        (snapshot / rel).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / rel).write_text(text)
    return tmp_path


def _run(work: Path, text: str, timeout: float = 60.0) -> Any:
    """The gate's result for the variant whose definition is `text`."""
    args = argparse.Namespace(python=sys.executable, timeout=timeout, e2e=False, keep=False,
                              hypothesis_seed=None)
    runner = mutants.Runner(args, work, ["tests/test_tiny.py"])
    return runner.variant(1, mutants.Variant(f"t: {text}", "drop-effect", "t", text))


class TestClassification:
    def test_a_test_failing_only_on_the_variant_kills_it(self, work: Path) -> None:
        """A test that fails on the variant and passes when rerun on the unmutated tree kills it."""
        r = _run(work, "mutated")
        assert (r.result, r.first_failure, r.rerun) == (
            mutants.KILLED, "tests/test_tiny.py::test_the_definition", "passed")

    def test_a_test_failing_on_the_unmutated_tree_too_is_flaky(self, work: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
        """A variant whose killing test also fails when rerun on the unmutated tree is flaky, not
        killed, and says how the rerun went."""
        monkeypatch.setenv("TINY", "broken")
        r = _run(work, "mutated")
        assert (r.result, r.first_failure) == (mutants.FLAKY, "tests/test_tiny.py::test_the_definition")
        assert r.rerun == "failed (pytest exit status 1)"

    def test_a_test_failed_by_pytest_timeout_is_a_timeout(self, work: Path) -> None:
        """A variant whose only failure is a test pytest-timeout stopped is a timeout, not killed."""
        r = _run(work, "hang")
        assert (r.result, r.first_failure) == (mutants.TIMEOUT, "tests/test_tiny.py::test_hang")
        assert r.rerun == ""

    def test_a_run_stopped_at_the_deadline_is_a_timeout(self, work: Path) -> None:
        """A variant whose run is still going at the gate's deadline, no test having failed, is a
        timeout, not killed."""
        r = _run(work, "stall", timeout=3)
        assert (r.result, r.first_failure) == (mutants.TIMEOUT, "")
        assert "deadline" in r.detail

    def test_a_real_failure_before_the_deadline_still_kills(self, work: Path) -> None:
        """A variant on which a test really failed before the run hung past the deadline is killed."""
        r = _run(work, "fail-then-hang", timeout=5)
        assert (r.result, r.first_failure, r.rerun) == (
            mutants.KILLED, "tests/test_tiny.py::test_the_definition", "passed")


# One variant of each kind the report tells apart.
REPORTED = [
    mutants.Result("a: drop effect x", "drop-effect", "a", mutants.KILLED, "unit", "tests/t.py::k",
                   rerun="passed"),
    mutants.Result("b: drop effect y", "drop-effect", "b", mutants.FLAKY, "unit", "tests/t.py::f",
                   rerun="failed (pytest exit status 1)"),
    mutants.Result("c: drop effect z", "drop-effect", "c", mutants.TIMEOUT, "unit",
                   detail="stopped at the deadline (--timeout)"),
    mutants.Result("d: add source s", "add-source", "d", mutants.SURVIVED, "unit"),
]


class TestReport:
    def test_the_summary_counts_only_real_kills_and_names_the_others(self) -> None:
        """The summary counts flaky and timed-out variants apart from the killed ones, by name."""
        line = mutants.summary(REPORTED)
        assert line.startswith("killed 1 / total 4 ")
        assert "survivors: d: add source s;" in line
        assert "flaky 1 (the killing test fails on the unmutated tree too): b: drop effect y;" in line
        assert line.endswith("timeout 1: c: drop effect z")

    def test_the_table_says_how_a_flaky_variants_rerun_went(self) -> None:
        """The table's row of a flaky variant names its test and the rerun's outcome."""
        row = next(line for line in mutants.table(REPORTED).splitlines() if line.startswith("b:"))
        assert "flaky" in row and "tests/t.py::f [rerun on the unmutated tree: failed" in row

    def test_the_json_lists_the_variants_not_killed(self, tmp_path: Path) -> None:
        """The JSON report lists the survivors, the flaky and the timed-out variants by id."""
        out = tmp_path / "results.json"
        mutants.write_json(out, {}, REPORTED)
        body = json.loads(out.read_text())
        assert (body["survived"], body["flaky"], body["timeout"]) == (
            ["d: add source s"], ["b: drop effect y"], ["c: drop effect z"])
        assert body["variants"][1]["rerun"] == "failed (pytest exit status 1)"


# A stand-in for `python -m agent_fsm_lab.modelcheck --mutants` in the tiny snapshot: it writes
# the verdicts the real check would (what it was asked is written beside them), or, with
# TINY_MC=broken, fails as the check does when the unmutated definition breaks a rule.
TINY_MODELCHECK = '''
import json, os, sys
args = sys.argv[1:]
if os.environ.get("TINY_MC") == "broken":
    print("error: the shipped definition fails the model check", file=sys.stderr)
    sys.exit(2)
out = args[args.index("--output") + 1]
json.dump({"summary": "2 variants: 1 caught, 1 equivalent, 0 survived", "args": args,
           "variants": [
               {"id": "a: drop effect x", "outcome": "caught",
                "why": "converged-is-last-good (3 steps): converged with 2.0.0 selected",
                "seconds": 1.0},
               {"id": "d: add source s", "outcome": "equivalent",
                "why": "the same reachable behaviour (734 configurations)", "seconds": 5.0}]},
          open(out, "w"))
sys.exit(0)
'''


class TestModelcheckFirst:
    @pytest.fixture
    def snapshot(self, work: Path) -> Path:
        tree = work / "snapshot"
        for rel, text in {"agent_fsm_lab/__init__.py": "", "agent_fsm_lab/modelcheck/__init__.py": "",
                          "agent_fsm_lab/modelcheck/__main__.py": TINY_MODELCHECK}.items():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            (tree / rel).write_text(text)
        (work / "logs").mkdir()
        return tree

    def test_a_variant_the_model_check_catches_is_killed_without_the_suite(
            self, work: Path, snapshot: Path) -> None:
        """With --modelcheck-first, a variant the model check catches is killed at stage
        "modelcheck" with the rule it broke; one it calls equivalent is left for the suite."""
        body = mutants.modelcheck_verdicts(sys.executable, snapshot, 2, ["^a:"], work / "logs")
        assert body["args"][-1] == "--only=^a:" and "--jobs" in body["args"]
        checked = {c["id"]: f"{c['outcome']}: {c['why']}" for c in body["variants"]}
        to_run = [(1, mutants.Variant("a: drop effect x", "drop-effect", "a", "")),
                  (2, mutants.Variant("d: add source s", "add-source", "d", ""))]
        killed, rest = mutants.modelcheck_kills(to_run, checked)
        assert [v.id for _, v in rest] == ["d: add source s"]
        r = killed["a: drop effect x"]
        assert (r.result, r.stage) == (mutants.KILLED, "modelcheck")
        assert r.detail.startswith("converged-is-last-good")
        assert "by the model check 1" in mutants.summary([r])
        assert "[model check] converged-is-last-good (3 steps)" in mutants.table([r])

    def test_a_model_check_that_cannot_judge_stops_the_gate(
            self, work: Path, snapshot: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """When the model check cannot judge the variants (the unmutated definition breaks a
        rule), the gate says so with its message instead of counting anything as killed."""
        monkeypatch.setenv("TINY_MC", "broken")
        with pytest.raises(RuntimeError, match="status 2: error: the shipped definition fails"):
            mutants.modelcheck_verdicts(sys.executable, snapshot, 2, [], work / "logs")

    def test_a_survivor_shows_the_model_checks_verdict(self) -> None:
        """The table's row of a survivor names the model check's verdict on it."""
        r = mutants.Result("d: add source s", "add-source", "d", mutants.SURVIVED, "unit",
                           modelcheck="equivalent: the same reachable behaviour")
        row = mutants.table([r]).splitlines()[-1]
        assert row.endswith("[model check: equivalent]")
