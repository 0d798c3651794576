"""Mutation gate for the machine definition: every one-step variant of states/agent-upgrade.toml
must make the test suite fail, or it is reported as a survivor.

Run from the repository root (not part of `make test`; a killed variant takes seconds, a survivor
the whole unit suite):

    .venv/bin/python -m agent_fsm_lab.mutants [--jobs 2] [--e2e] [--only REGEX] [--output FILE]

The variants: drop one effect, swap two adjacent effects, drop one condition, add one source
state (each declared state not already a source), for every transition. A variant the
definition loader refuses (an unreachable state, a trap) is killed "at load". The working tree is
snapshotted once (`git ls-files -co --exclude-standard`) into a scratch directory under /var/tmp
and the unmutated snapshot must pass first (the baseline); then each variant runs in its own copy
of the snapshot, with its diagram page regenerated (the drift check must not count) and
PYTHONPATH set to the copy, through `pytest -x`: the unit suite first, ordered so that the fast
and discriminating files come first, then (with --e2e) the e2e suite for the survivors.

Only a test that fails counts as a kill, and only if it passes when rerun once, alone, on a fresh
copy of the unmutated snapshot: if it fails there too the variant is "flaky", not killed. A run
that reaches the deadline (--timeout), or whose failure is pytest-timeout's, is "timeout", not
killed, unless a test had really failed first.

With --modelcheck-first, the model check (`python -m agent_fsm_lab.modelcheck --mutants`, run in
the snapshot first, docs/reliability.md) judges the variants before the suite does: one it
catches (a rule of docs/design.md broken, within its bound) is killed at stage "modelcheck"
without running the suite; the others run the suite as without it, and the table notes the
model check's verdict on a survivor ("equivalent": the same reachable behaviour within its bound;
"equivalent-at-rest": every rule kept and the same configurations at rest, not the same way).
The model check is deterministic and the unmutated definition must pass it first (its baseline).

Exit status: 0 when every variant is killed, 1 when some survive, are flaky or time out, 2 when
the baseline or the set-up fails.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent_fsm import files

ROOT = Path(__file__).resolve().parent.parent
DEFINITION = Path("states") / "agent-upgrade.toml"
DIAGRAM_DIR = "diagrams"
# Fast files that look at the machine itself first; the rest follow by their baseline time.
FIRST = ("tests/upgrade/test_rule.py", "tests/machine/test_machine.py",
         "tests/upgrade/test_order.py", "tests/machine/test_definition.py",
         "tests/reliability/test_crash.py", "tests/reliability/test_model.py")
E2E_DIR = "tests/e2e"
PYTEST = ("-m", "pytest", "-x", "-q", "-p", "no:cacheprovider")
# A line of pytest's short summary (not a captured log record, which also starts with ERROR).
FAILED_LINE = re.compile(r"^(FAILED|ERROR) ([\w./-]+\.py(?:::.*?)?)(?: - (.*))?$")

KILLED, SURVIVED, REFUSED, TIMEOUT, ERROR = "killed", "survived", "refused-at-load", "timeout", "error"
FLAKY = "flaky"  # killed by a test that fails on the unmutated tree too
NOT_KILLED = (SURVIVED, FLAKY, TIMEOUT)
# The failure pytest-timeout (the suite's per-test bound) raises in a hung test, as its traceback
# shows it (the short summary may cut the message).
PYTEST_TIMEOUT = re.compile(r"^E\s+Failed: Timeout \(>[\d.]+s\) from pytest-timeout\.$", re.M)

# Run with the snapshot's interpreter and PYTHONPATH: loads each variant through the project's own
# loader and says which ones it refuses (a DefinitionError) and why.
LOAD_CHECK = r"""
import importlib, json, pkgutil, sys
import agent_fsm
KNOWN = ["agent_fsm.upgrade.registry", "agent_fsm.upgrade.effects", "agent_fsm.machine.engine",
         "agent_fsm.machine"]
def candidates():
    yield from KNOWN
    for m in pkgutil.walk_packages(agent_fsm.__path__, "agent_fsm.", onerror=lambda name: None):
        if not m.name.endswith("__main__"):  # importing that would run the CLI
            yield m.name
load = None
for name in candidates():  # the layout moves; find the module that has it
    try:
        load = importlib.import_module(name).load_definition
        break
    except (ImportError, AttributeError):
        pass
if load is None:
    sys.exit("no module of agent_fsm has load_definition")
out = {}
for item in json.load(sys.stdin):
    try:
        load(item["text"], item["source"])
        out[item["id"]] = None
    except Exception as exc:
        kind = "refused" if type(exc).__name__ == "DefinitionError" else "error"
        out[item["id"]] = [kind, f"{type(exc).__name__}: {exc}"]
json.dump({"agent_fsm": agent_fsm.__file__, "results": out}, sys.stdout)
"""


# The variants -------------------------------------------------------------------------------------

@dataclass
class Variant:
    """One one-step change of the definition: its id, what it changes, and the resulting text."""

    id: str
    operator: str
    trigger: str
    text: str = field(repr=False)


def _effect_name(item: Any) -> str:
    return str(item["name"]) if isinstance(item, dict) else str(item)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {value!r} as TOML")


def _replace_key(text: str, index: int, key: str, value: Any) -> str:
    """The text with `key` of the index-th [[transitions]] table set to `value`.

    Only the lines of that one key change (its value may span lines); comments and layout stay.
    """
    lines = text.splitlines(keepends=True)
    headers = [i for i, line in enumerate(lines) if line.strip() == "[[transitions]]"]
    start = headers[index] + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("[")), len(lines))
    key_line = re.compile(rf"^(\s*){re.escape(key)}\s*=")
    new = f"{key} = {_toml_value(value)}\n"
    for i in range(start, end):
        m = key_line.match(lines[i])
        if not m:
            continue
        for j in range(i + 1, end + 1):  # the value ends where the lines so far parse
            try:
                tomllib.loads("".join(lines[i:j]))
            except tomllib.TOMLDecodeError:
                continue
            return "".join([*lines[:i], m.group(1) + new, *lines[j:]])
        raise ValueError(f"transition #{index + 1}: cannot find the end of `{key}`")
    return "".join([*lines[:start], new, *lines[start:]])


def variants(text: str) -> list[Variant]:
    """Every one-step variant of the definition `text`, each checked to parse to what it means."""
    data = tomllib.loads(text)
    states = list(data.get("states", {}))
    out: list[Variant] = []
    seen_ids: set[str] = set()
    seen_data: list[Any] = [data]

    def add(operator: str, index: int, what: str, key: str, value: list[Any]) -> None:
        trigger = str(data["transitions"][index]["trigger"])
        expected = copy.deepcopy(data)
        expected["transitions"][index][key] = value
        if expected in seen_data:  # e.g. swapping two equal effects: no change
            return
        seen_data.append(expected)
        new_text = _replace_key(text, index, key, value)
        if tomllib.loads(new_text) != expected:
            raise AssertionError(f"{trigger}: {what}: the rewritten text does not parse as intended")
        vid, n = f"{trigger}: {what}", 2
        while vid in seen_ids:
            vid, n = f"{trigger}: {what} (#{n})", n + 1
        seen_ids.add(vid)
        out.append(Variant(vid, operator, trigger, new_text))

    for i, t in enumerate(data.get("transitions", [])):
        effects = list(t.get("effects", []))
        for j, e in enumerate(effects):
            add("drop-effect", i, f"drop effect {_effect_name(e)}", "effects", effects[:j] + effects[j + 1:])
        for j in range(len(effects) - 1):
            swapped = [*effects[:j], effects[j + 1], effects[j], *effects[j + 2:]]
            add("swap-effects", i,
                f"swap effects {_effect_name(effects[j])} <-> {_effect_name(effects[j + 1])}",
                "effects", swapped)
        conditions = list(t.get("conditions", []))
        for j, c in enumerate(conditions):
            add("drop-condition", i, f"drop condition {c}", "conditions",
                conditions[:j] + conditions[j + 1:])
        source = t.get("source")
        sources = [source] if isinstance(source, str) else list(source or [])
        for s in states:
            if s not in sources:
                add("add-source", i, f"add source {s}", "source", [*sources, s])
    return out


# Running ------------------------------------------------------------------------------------------

@dataclass
class Result:
    id: str
    operator: str
    trigger: str
    result: str
    stage: str = ""  # load, unit or e2e: where it was killed (or how far it got)
    first_failure: str = ""
    detail: str = ""
    seconds: float = 0.0
    log: str = ""
    rerun: str = ""  # the killing test rerun on the unmutated tree: passed, failed or timed out
    modelcheck: str = ""  # with --modelcheck-first: the model check's verdict and why


class TimedOut(Exception):
    pass


# The children running now. Each has its own process group (a timeout kills the whole group), so a
# signal to this process does not reach them: the handler below kills them before exiting.
_LIVE: set[subprocess.Popen[bytes]] = set()
_LIVE_LOCK = threading.Lock()


def _kill_children_and_exit(signum: int, _frame: object) -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for proc in live:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    print(f"\n[mutants] stopped by signal {signum}: killed {len(live)} running test process group(s)",
          file=sys.stderr, flush=True)
    os._exit(128 + signum)


def snapshot(repo: Path, dest: Path, rev: str | None = None) -> None:
    """Copy the working tree's tracked and untracked-not-ignored files, symlinks as symlinks
    (or, with `rev`, that commit's tree)."""
    if rev is not None:
        dest.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", "--format=tar", rev], cwd=repo,
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
        return
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=repo,
                            capture_output=True, check=True).stdout.decode()
    for rel in sorted({p for p in listed.split("\0") if p}):
        src = repo / rel
        if not (src.exists() or src.is_symlink()):
            continue  # deleted in the working tree, not yet in the index
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            target.symlink_to(os.readlink(src))
        elif src.is_file():
            shutil.copy2(src, target)


def child_env(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AGENT_FSM_CONFIG")}
    env["PYTHONPATH"] = str(tree)
    return env


def run(argv: list[str], tree: Path, log: Path, deadline: float) -> int:
    """Run argv in `tree` (its own process group), appending its output to `log`."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimedOut
    with log.open("a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        with _LIVE_LOCK:
            proc = subprocess.Popen(argv, cwd=tree, env=child_env(tree), stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
            _LIVE.add(proc)
        try:
            return proc.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            out.write("\n[mutants] timed out: process group killed\n")
            raise TimedOut from None
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(proc)


def first_failure(output: str) -> tuple[str, str]:
    """The node id and message of the first FAILED/ERROR line of pytest's short summary."""
    lines = output.splitlines()
    marks = [i for i, line in enumerate(lines) if "short test summary info" in line]
    for line in lines[marks[-1] if marks else 0:]:
        m = FAILED_LINE.match(line)
        if m:
            node, message = m.group(2), m.group(3) or ""
            if not message.strip():  # -q leaves it out: the first `E ` line of the traceback
                message = next((e[1:] for e in lines if e.startswith("E ")), "")
            return node.strip(), message.strip()[:300]
    return "", ""


def verdict(rc: int | None, output: str) -> tuple[str, str, str]:
    """(result, first failing node id, message) of a pytest -x run from its exit status (None: it
    was stopped at the deadline) and its output. A timeout alone is no kill: a run stopped at the
    deadline, or failed by pytest-timeout, is TIMEOUT unless a test had really failed first."""
    node, message = first_failure(output)
    if rc == 0:
        return SURVIVED, "", ""
    hung = PYTEST_TIMEOUT.search(output) is not None  # with -x, the one failure's traceback
    if node and not hung and rc in (None, 1, 2):
        return KILLED, node, message
    if rc is None or (node and hung):
        return TIMEOUT, node, message or "stopped at the deadline (--timeout)"
    tail = " | ".join(output.strip().splitlines()[-3:])
    return ERROR, "", f"pytest exit status {rc}: {tail}"[:300]


def pytest_stage(python: str, tree: Path, log: Path, deadline: float,
                 args: list[str]) -> tuple[str, str, str]:
    """(result, first failing node id, message) of one pytest run with -x."""
    before = log.stat().st_size if log.exists() else 0
    rc: int | None
    try:
        rc = run([python, *PYTEST, *args], tree, log, deadline)
    except TimedOut:
        rc = None
    with log.open() as f:
        f.seek(before)
        output = f.read()
    return verdict(rc, output)


class Runner:
    def __init__(self, args: argparse.Namespace, work: Path, order: list[str]) -> None:
        self.python: str = args.python
        self.timeout: float = args.timeout
        self.e2e: bool = args.e2e
        self.keep: bool = args.keep
        self.hypothesis_seed: str | None = args.hypothesis_seed
        self.work = work
        self.order = order
        self.logs = work / "logs"
        self.logs.mkdir(exist_ok=True)
        self.seen_file = ""

    def seed_args(self) -> list[str]:
        return [f"--hypothesis-seed={self.hypothesis_seed}"] if self.hypothesis_seed else []

    def unit_args(self) -> list[str]:
        return [*self.seed_args(), "-m", "not e2e", *self.order]

    def prepare(self, name: str, text: str | None, log: Path, deadline: float) -> Path:
        """A fresh copy of the snapshot with `text` as its definition and its diagram regenerated."""
        tree = self.work / name
        shutil.rmtree(tree, ignore_errors=True)
        shutil.copytree(self.work / "snapshot", tree, symlinks=True)
        if text is not None:
            (tree / DEFINITION).write_text(text, encoding="utf-8")
        probe = subprocess.run([self.python, "-c", "import agent_fsm; print(agent_fsm.__file__)"],
                               cwd=tree, env=child_env(tree), capture_output=True, text=True,
                               check=False)
        imported = probe.stdout.strip()
        if not imported.startswith(str(tree) + os.sep):
            raise RuntimeError(f"agent_fsm is imported from {imported or probe.stderr!r}, not {tree}")
        self.seen_file = imported
        rc = run([self.python, "-m", "agent_fsm_lab", "diagram", "--write", "--dir", DIAGRAM_DIR],
                 tree, log, deadline)
        if rc != 0:
            last = log.read_text(errors="replace").strip().splitlines()[-1:]
            raise RuntimeError(f"`agent_fsm_lab diagram --write` failed with status {rc}: "
                               f"{' '.join(last)[:200]} (see {log})")
        return tree

    def variant(self, number: int, v: Variant) -> Result:
        result = Result(v.id, v.operator, v.trigger, ERROR)
        log = self.logs / f"{number:03d}.log"
        log.write_text(f"# {v.id}\n")
        result.log = str(log)
        started = time.monotonic()
        deadline = started + self.timeout
        tree = self.work / f"v{number:03d}"
        try:
            self.prepare(tree.name, v.text, log, deadline)
            result.stage = "unit"
            result.result, result.first_failure, result.detail = pytest_stage(
                self.python, tree, log, deadline, self.unit_args())
            if result.result == SURVIVED and self.e2e:
                result.stage = "e2e"
                result.result, result.first_failure, result.detail = pytest_stage(
                    self.python, tree, log, deadline, ["-m", "e2e", E2E_DIR])
            if result.result == KILLED:
                result.rerun = self.rerun_on_baseline(number, result.first_failure, log)
                if result.rerun != "passed":
                    result.result = FLAKY
        except TimedOut:
            result.result, result.detail = TIMEOUT, f"over {self.timeout:.0f} s"
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            result.result, result.detail = ERROR, str(exc)[:300]
        finally:
            if not self.keep:
                shutil.rmtree(tree, ignore_errors=True)
        result.seconds = round(time.monotonic() - started, 1)
        return result

    def rerun_on_baseline(self, number: int, node: str, log: Path) -> str:
        """The test that killed variant `number`, run once alone on a fresh unmutated copy:
        "passed", "failed (pytest exit status N)" or "timed out"."""
        with log.open("a") as out:
            out.write(f"\n# {node} again, on the unmutated tree\n")
        deadline = time.monotonic() + self.timeout
        tree = self.work / f"b{number:03d}"
        try:
            self.prepare(tree.name, None, log, deadline)
            rc = run([self.python, *PYTEST, *self.seed_args(), node], tree, log, deadline)
        except TimedOut:
            return "timed out"
        finally:
            if not self.keep:
                shutil.rmtree(tree, ignore_errors=True)
        return "passed" if rc == 0 else f"failed (pytest exit status {rc})"

    def baseline(self) -> dict[str, Any]:
        """Run the unmutated snapshot through the same steps, without -x's early stop mattering:
        it must pass. Its JUnit times order the unit files (fastest first after FIRST)."""
        log = self.logs / "baseline.log"
        log.write_text("# baseline (unmutated)\n")
        started = time.monotonic()
        deadline = started + self.timeout * 2
        junit = self.logs / "baseline-junit.xml"
        out: dict[str, Any] = {"log": str(log)}
        try:
            tree = self.prepare("baseline", None, log, deadline)
            out["agent_fsm"] = self.seen_file
            rc = run([self.python, *PYTEST, f"--junitxml={junit}", *self.unit_args()],
                     tree, log, deadline)
            out["unit"] = "passed" if rc == 0 else (
                f"failed (pytest exit status {rc}) at "
                f"{first_failure(log.read_text(errors='replace'))[0] or '?'}")
            out["unit_seconds"] = round(time.monotonic() - started, 1)
            if rc == 0 and junit.exists():
                self.order = order_by_time(tree, self.order, junit)
            if rc == 0 and self.e2e:
                t0 = time.monotonic()
                rc = run([self.python, *PYTEST, "-m", "e2e", E2E_DIR], tree, log, deadline)
                out["e2e"] = "passed" if rc == 0 else f"failed (pytest exit status {rc})"
                out["e2e_seconds"] = round(time.monotonic() - t0, 1)
            out["ok"] = rc == 0
        except TimedOut:
            out["ok"], out["unit"] = False, "timed out"
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            out["ok"], out["unit"] = False, f"set-up failed: {exc}"
        if not self.keep:
            shutil.rmtree(self.work / "baseline", ignore_errors=True)
        out["order"] = self.order
        return out


def unit_files(tree: Path) -> list[str]:
    """The unit test files: FIRST in its order, then the others found under tests/ (not e2e)."""
    found = sorted(str(p.relative_to(tree)) for p in (tree / "tests").rglob("test_*.py")
                   if E2E_DIR not in str(p.relative_to(tree)))
    return [f for f in FIRST if f in found] + [f for f in found if f not in FIRST]


def order_by_time(tree: Path, order: list[str], junit: Path) -> list[str]:
    """FIRST as given, then the other files by their total time in the baseline, fastest first."""
    modules = {f.removesuffix(".py").replace("/", "."): f for f in order}
    spent = dict.fromkeys(order, 0.0)
    for case in ET.parse(junit).iter("testcase"):
        classname = case.get("classname", "")
        for module, f in modules.items():
            if classname == module or classname.startswith(module + "."):
                spent[f] += float(case.get("time", "0") or 0)
                break
    rest = sorted((f for f in order if f not in FIRST), key=lambda f: spent[f])
    return [f for f in order if f in FIRST] + rest


def refused_at_load(python: str, tree: Path, vs: list[Variant]) -> dict[str, list[str] | None]:
    """Which variants the snapshot's own loader refuses: id -> [kind, message] or None."""
    payload = json.dumps([{"id": v.id, "text": v.text, "source": str(DEFINITION)} for v in vs])
    proc = subprocess.run([python, "-c", LOAD_CHECK], cwd=tree, env=child_env(tree), input=payload,
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"the load check failed: {proc.stderr.strip()[-500:]}")
    answer = json.loads(proc.stdout)
    if not str(answer["agent_fsm"]).startswith(str(tree) + os.sep):
        raise RuntimeError(f"the load check imported agent_fsm from {answer['agent_fsm']}")
    results: dict[str, list[str] | None] = answer["results"]
    return results


def modelcheck_verdicts(python: str, tree: Path, jobs: int, only: list[str],
                        logs: Path) -> dict[str, Any]:
    """The model check's verdicts on the variants (`--only` as given), run in the snapshot: its
    JSON (its "variants": id, outcome, why, seconds; its "summary"). RuntimeError when it cannot
    judge them (the unmutated definition breaks a rule, or the snapshot has no such check)."""
    out, log = logs / "modelcheck.json", logs / "modelcheck.log"
    argv = [python, "-m", "agent_fsm_lab.modelcheck", "--mutants", "--jobs", str(max(1, jobs)),
            "--output", str(out), *(f"--only={p}" for p in only)]
    with log.open("w") as f:
        proc = subprocess.run(argv, cwd=tree, env=child_env(tree), stdout=f,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, check=False)
    if proc.returncode not in (0, 1) or not out.exists():
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
        raise RuntimeError(f"the model check of the variants failed with status "
                           f"{proc.returncode}: {tail[:400]} (see {log})")
    body: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return body


def modelcheck_kills(to_run: list[tuple[int, Variant]], checked: dict[str, str],
                     ) -> tuple[dict[str, Result], list[tuple[int, Variant]]]:
    """The variants the model check caught (`checked`: id -> "outcome: why"), killed at stage
    "modelcheck", and the others, left for the suite."""
    killed = {v.id: Result(v.id, v.operator, v.trigger, KILLED, stage="modelcheck",
                           first_failure="model check",
                           detail=checked[v.id].removeprefix("caught: ")[:300],
                           modelcheck=checked[v.id][:300])
              for _, v in to_run if checked.get(v.id, "").startswith("caught:")}
    return killed, [(n, v) for n, v in to_run if v.id not in killed]


# Reporting ----------------------------------------------------------------------------------------

def table(results: list[Result]) -> str:
    width = max([len(r.id) for r in results] + [7])
    lines = [f"{'variant':<{width}}  {'result':<15}  first failing test / note", "-" * (width + 60)]
    for r in results:
        note = r.first_failure or r.detail
        if r.result == FLAKY:
            note = f"{note} [rerun on the unmutated tree: {r.rerun}]"
        if r.result in (KILLED, FLAKY, TIMEOUT) and r.stage == "e2e":
            note = f"[e2e] {note}"
        if r.result == KILLED and r.stage == "modelcheck":
            note = f"[model check] {r.detail}"
        elif r.modelcheck and r.result in NOT_KILLED:
            note = f"{note} [model check: {r.modelcheck.split(':')[0]}]".strip()
        lines.append(f"{r.id:<{width}}  {r.result:<15}  {note}".rstrip())
    return "\n".join(lines)


def summary(results: list[Result]) -> str:
    def count(result: str, stage: str | None = None) -> int:
        return sum(1 for r in results if r.result == result and (stage is None or r.stage == stage))

    def named(result: str) -> str:
        return "; ".join(r.id for r in results if r.result == result) or "none"

    killed = count(KILLED) + count(REFUSED)
    line = (f"killed {killed} / total {len(results)} (unit {count(KILLED, 'unit')}, "
            f"e2e {count(KILLED, 'e2e')}, at load {count(REFUSED)}")
    if count(KILLED, "modelcheck"):
        line += f", by the model check {count(KILLED, 'modelcheck')}"
    if count(ERROR):
        line += f"; errors {count(ERROR)}: {named(ERROR)}"
    return (line + f"); survivors: {named(SURVIVED)}; flaky {count(FLAKY)} (the killing test fails "
            f"on the unmutated tree too): {named(FLAKY)}; timeout {count(TIMEOUT)}: {named(TIMEOUT)}")


def write_json(path: Path, meta: dict[str, Any], results: list[Result]) -> None:
    body = {**meta, "summary": summary(results),
            **{key: [r.id for r in results if r.result == key] for key in NOT_KILLED},
            "variants": [asdict(r) for r in results]}
    files.atomic_write(path, (json.dumps(body, indent=2) + "\n").encode(), 0o644)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=1, help="variants run in parallel (default 1)")
    parser.add_argument("--only", action="append", metavar="REGEX", default=[],
                        help="run only the variants whose id matches (re.search); repeatable")
    parser.add_argument("--e2e", action="store_true",
                        help="run `pytest -m e2e` for the survivors of the unit suite")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds per variant before it counts as timed out, not killed (900)")
    parser.add_argument("--output", type=Path, default=Path("mutants-results.json"),
                        help="where to write the JSON results (mutants-results.json)")
    parser.add_argument("--repo", type=Path, default=ROOT, help="the working tree to snapshot")
    parser.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"),
                        help="the interpreter that runs the tests (the project's venv)")
    parser.add_argument("--rev", default=None,
                        help="test this commit's tree (git archive) instead of the working tree")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="scratch directory (default: a new one under /var/tmp)")
    parser.add_argument("--hypothesis-seed", default=None,
                        help="pass --hypothesis-seed to pytest, for reproducible model tests")
    parser.add_argument("--keep", action="store_true", help="keep the copies, not only the logs")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the unmutated run (and its time-based ordering)")
    parser.add_argument("--list", action="store_true", help="list the variant ids and exit")
    parser.add_argument("--modelcheck-first", action="store_true",
                        help="let the model check judge the variants first: those it catches "
                             "are killed without running the suite")
    args = parser.parse_args(argv)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _kill_children_and_exit)

    repo = args.repo.resolve()
    if args.rev is not None:
        text = subprocess.run(["git", "show", f"{args.rev}:{DEFINITION}"], cwd=repo,
                              capture_output=True, text=True, check=True).stdout
    else:
        text = (repo / DEFINITION).read_text(encoding="utf-8")
    all_variants = variants(text)
    selected = [v for v in all_variants
                if not args.only or any(re.search(p, v.id) for p in args.only)]
    if args.list:
        print("\n".join(v.id for v in selected))
        return 0
    if not selected:
        print("no variant matches --only", file=sys.stderr)
        return 2

    if args.workdir:
        work = args.workdir.resolve()
        work.mkdir(parents=True, exist_ok=True)
    else:
        work = Path(tempfile.mkdtemp(prefix="agent-fsm-mutants-", dir="/var/tmp"))
    shutil.rmtree(work / "snapshot", ignore_errors=True)
    snapshot(repo, work / "snapshot", args.rev)
    subprocess.run([args.python, "-m", "compileall", "-q", "agent_fsm", "tests"],
                   cwd=work / "snapshot", capture_output=True, check=False)
    # Generate from the snapshot, so the variants and the code they run against are one version.
    all_variants = variants((work / "snapshot" / DEFINITION).read_text(encoding="utf-8"))
    selected = [v for v in all_variants
                if not args.only or any(re.search(p, v.id) for p in args.only)]
    runner = Runner(args, work, unit_files(work / "snapshot"))
    meta: dict[str, Any] = {
        "definition": str(DEFINITION), "workdir": str(work), "e2e": args.e2e, "jobs": args.jobs,
        "timeout": args.timeout, "variants_total": len(all_variants), "selected": len(selected),
    }
    print(f"[mutants] {len(selected)} of {len(all_variants)} variants; snapshot and logs in {work}",
          flush=True)

    if not args.no_baseline:
        base = runner.baseline()
        meta["baseline"] = base
        print(f"[mutants] baseline: unit {base.get('unit')} in {base.get('unit_seconds', '?')} s"
              + (f", e2e {base['e2e']} in {base.get('e2e_seconds')} s" if "e2e" in base else "")
              + f"; agent_fsm from {base.get('agent_fsm', '?')}", flush=True)
        if not base.get("ok"):
            write_json(args.output, meta, [])
            print(f"[mutants] the unmutated tree does not pass: see {base['log']}", file=sys.stderr)
            return 2
    meta["order"] = runner.order
    print(f"[mutants] unit order: {' '.join(runner.order)}", flush=True)

    try:
        load = refused_at_load(args.python, work / "snapshot", selected)
    except RuntimeError as exc:
        print(f"[mutants] {exc}", file=sys.stderr)
        return 2
    results: dict[str, Result] = {}
    to_run: list[tuple[int, Variant]] = []
    for number, v in enumerate(selected, 1):
        verdict = load.get(v.id)
        if verdict is None:
            to_run.append((number, v))
        else:
            kind, message = verdict
            results[v.id] = Result(v.id, v.operator, v.trigger, REFUSED if kind == "refused" else ERROR,
                                   stage="load", detail=message[:300])
    checked: dict[str, str] = {}  # id -> the model check's "outcome: why"
    if args.modelcheck_first and to_run:
        began = time.monotonic()
        try:
            body = modelcheck_verdicts(args.python, work / "snapshot", args.jobs, args.only,
                                       runner.logs)
        except RuntimeError as exc:
            print(f"[mutants] {exc}", file=sys.stderr)
            write_json(args.output, meta, [])
            return 2
        meta["modelcheck"] = body.get("summary", "")
        print(f"[mutants] model check in {time.monotonic() - began:.0f} s: {meta['modelcheck']}",
              flush=True)
        checked = {str(c["id"]): f"{c['outcome']}: {c['why']}" for c in body.get("variants", [])}
        killed, to_run = modelcheck_kills(to_run, checked)
        results.update(killed)

    lock = threading.Lock()

    def ordered() -> list[Result]:
        return [results[v.id] for v in selected if v.id in results]

    done = len(results)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(runner.variant, n, v): v for n, v in to_run}
        for future in concurrent.futures.as_completed(futures):
            r = future.result()
            r.modelcheck = checked.get(r.id, "")[:300]
            with lock:
                results[r.id] = r
                done += 1
                write_json(args.output, meta, ordered())
            print(f"[mutants] {done}/{len(selected)} {r.id}: {r.result} "
                  f"{r.first_failure or r.detail} ({r.seconds} s)", flush=True)

    final = ordered()
    write_json(args.output, meta, final)
    print()
    print(table(final))
    print()
    print(summary(final))
    if any(r.result == ERROR for r in final):
        return 2
    return 1 if any(r.result in NOT_KILLED for r in final) else 0


if __name__ == "__main__":
    sys.exit(main())
