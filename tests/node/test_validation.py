"""Files whose checksum is right but whose content is not: every field read
back is checked, and a bad one is refused in one line naming the file, the field and the value,
with exit 1, no traceback, the file left as it was, and `doctor` failing on it."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_fsm.errors import Invalid, PublishError, SignalError, StateFileError
from agent_fsm.node.runtime import signal as signal_file
from agent_fsm.node.state import journal, validate
from agent_fsm.node.state.store import checksum
from agent_fsm.system.publish import RecordPublisher, Result
from agent_fsm.views.doctor.checks import doctor
from tests.helpers import Crash, World, copy_tree, crash_at, make_world

ROOT = Path(__file__).resolve().parents[2]
CONFIG = 'name = "agent"\n[judgment]\ndeadline_seconds = 60\nsoak_seconds = 5\nmax_attempts = 3\n'
GONE = object()  # the mutation that removes the key
NAN, INF = math.nan, math.inf




def _rich(world: World) -> World:
    """Every field of the state file filled: history, a rolled-back last result, counters, and
    a begin_upgrade crashed after three of its five effects (pending, upgrade, signal)."""
    c = world.node.controller
    world.installed("1.0.0")
    world.upgrading("2.0.0")
    c.fire("judge_failed")
    c.fire("recover")
    c.fire("recovered")
    world.add_release("3.0.0")
    c.failpoint = crash_at("begin_upgrade", 5)
    with pytest.raises(Crash):
        c.fire("begin_upgrade", release="3.0.0")
    return world


@pytest.fixture(scope="module")
def rich(tmp_path_factory: pytest.TempPathFactory) -> World:
    return _rich(make_world(tmp_path_factory.mktemp("rich") / "root"))


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory) -> World:
    """An upgrade being judged: the signal written and counted once, nothing owed."""
    return make_world(tmp_path_factory.mktemp("judged") / "root").installed("1.0.0").upgrading()


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(CONFIG)
    return path


def _copy(world: World, tmp_path: Path) -> World:
    copy_tree(world.root, tmp_path / "root")
    return make_world(tmp_path / "root")


def _set(data: Any, field: str, value: Any) -> None:
    """Set (or, with GONE, remove) `field` ("pending.args.release", "history[2].time")."""
    *path, last = field.replace("[", ".").replace("]", "").split(".")
    for part in path:
        data = data[int(part)] if isinstance(data, list) else data[part]
    key: Any = int(last) if isinstance(data, list) else last
    if value is GONE:
        del data[key]
    else:
        data[key] = value


def _mutated_state(raw: bytes, field: str, value: Any) -> bytes:
    """The state file with one field changed and the checksum right again (canonical layout)."""
    data = json.loads(raw)
    data.pop("checksum")
    _set(data, field, value)
    data["checksum"] = checksum(data)
    return (json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n").encode()


def _write_line(world: World, index: int, entry: dict[str, Any]) -> None:
    """Replace line `index` of the history journal with `entry`, its checksum right."""
    path = world.node.store.journal.path
    lines = path.read_bytes().splitlines(keepends=True)
    lines[index] = journal.encode(entry)
    path.write_bytes(b"".join(lines))


def _mutated_signal(raw: bytes, field: str, value: Any) -> bytes:
    """The signal with one field changed (or replaced whole, field ""), indented, and its
    checksum right again unless the case is the checksum itself."""
    data = json.loads(raw)
    if field == "":
        data = value
    else:
        data.pop("checksum")
        _set(data, field, value)
        data.setdefault("checksum", checksum(data))
    return (json.dumps(data, indent=2) + "\n").encode()


# (field, bad value, what the message names): at least one bad value for every field.
STATE_CASES: list[tuple[str, Any, str]] = [
    ("state", 5, "state is 5"),
    ("state", "flying", "state names unknown state 'flying'"),
    ("upgrade", "2.0.0", "upgrade is '2.0.0'"),
    ("upgrade", GONE, "upgrade is missing"),
    ("upgrade.from", "../etc", "upgrade.from is '../etc'"),
    ("upgrade.to", 7, "upgrade.to is 7"),
    ("upgrade.to", GONE, "upgrade.to is missing"),
    ("upgrade.started", "12", "upgrade.started is '12'"),
    ("upgrade.started", NAN, "upgrade.started is nan"),
    ("upgrade.started", INF, "upgrade.started is inf"),
    ("upgrade.started", -1, "upgrade.started is -1"),
    ("pending", [], "pending is []"),
    # A name this agent-fsm does not know passes (a later one's: tests/node/test_forward_compat.py);
    # what is no name at all does not.
    ("pending.trigger", "Explode!", "pending.trigger is 'Explode!', expected the name of a"),
    ("pending.trigger", None, "pending.trigger is None"),
    ("pending.source", "no where", "pending.source is 'no where', expected the name of a"),
    ("pending.dest", 3, "pending.dest is 3"),
    ("pending.effects", "close_gate", "pending.effects is 'close_gate'"),
    ("pending.effects.1", "rm -rf", "pending.effects[1] is 'rm -rf', expected the name of"),
    ("pending.done", -5, "pending.done is -5"),
    ("pending.done", 8, "pending.done is 8"),
    ("pending.done", 2.5, "pending.done is 2.5"),
    ("pending.done", True, "pending.done is True"),
    ("pending.args", [1], "pending.args is [1]"),
    ("pending.args.release", "a/b", "pending.args.release is 'a/b'"),
    ("pending.args.from", 5, "pending.args.from is 5"),
    ("pending.args.started", NAN, "pending.args.started is nan"),
    ("pending.args.attempt", -1, "pending.args.attempt is -1"),
    ("pending.args.no_start", "yes", "pending.args.no_start is 'yes'"),
    ("pending.args.upgrade", "1.0.0", "pending.args.upgrade is '1.0.0'"),
    ("pending.args.upgrade", {"from": "1.0.0"}, "pending.args.upgrade.to is missing"),
    ("pending.args.upgrade", {"from": "..", "to": "2.0.0"}, "pending.args.upgrade.from is '..'"),
    ("pending.started", INF, "pending.started is inf"),
    ("pending.started", GONE, "pending.started is missing"),
    ("last_result", "ok", "last_result is 'ok'"),
    ("last_result.from", None, "last_result.from is None"),
    ("last_result.to", "a b", "last_result.to is 'a b'"),
    ("last_result.outcome", "maybe", "last_result.outcome is 'maybe'"),
    ("last_result.started", -INF, "last_result.started is -inf"),
    ("last_result.time", "now", "last_result.time is 'now'"),
    ("last_result.reason", 7, "last_result.reason is 7"),
    ("last_result.reason_class", "bored", "last_result.reason_class is 'bored'"),
    ("seq", -1, "seq is -1"),
    ("seq", GONE, "seq is missing"),
    ("since", "x", "since is 'x'"),
    ("since", GONE, "since is missing"),
    ("last_transition", NAN, "last_transition is nan"),
    ("skipped", {}, "skipped is {}"),
    ("skipped", [3], "skipped[0] is 3"),
    ("skipped", [{"time": -1, "trigger": "recover", "effect": "close_gate", "error": "e"}],
     "skipped[0].time is -1"),
    ("skipped", [{"time": 1.0, "trigger": "Explode!", "effect": "close_gate", "error": "e"}],
     "skipped[0].trigger is 'Explode!'"),
    ("skipped", [{"time": 1.0, "trigger": "recover", "effect": "Explode!", "error": "e"}],
     "skipped[0].effect is 'Explode!'"),
    ("skipped", [{"time": 1.0, "trigger": "recover", "effect": "close_gate"}],
     "skipped[0].error is missing"),
    ("counters", [], "counters is []"),
    ("counters.attempts", -1, "counters.attempts is -1"),
    ("counters.attempts", 10**400, "counters.attempts is 1000"),
    ("counters.upgrades_ok", 1.5, "counters.upgrades_ok is 1.5"),
    ("counters.rollbacks", NAN, "counters.rollbacks is nan"),
    ("counters.upgrades_rolled_back", "1", "counters.upgrades_rolled_back is '1'"),
    ("counters.later", -1, "counters.later is -1"),  # a later agent-fsm's: a count all the same
    ("schema", 1, "has schema 1, expected 2"),
    ("kind", "hold", "kind is 'hold', expected 'state'"),
]
# (line index.field, bad value, what the message names): a history journal entry's fields.
ENTRY_CASES: list[tuple[str, Any, str]] = [
    ("0.seq", GONE, "has seq None, expected a positive integer"),
    ("0.seq", 0, "has seq 0, expected a positive integer"),
    ("0.time", GONE, "entry.time is missing"),
    ("0.time", NAN, "entry.time is nan"),
    ("0.time", 10**400, "entry.time is 1000"),
    ("3.trigger", "Explode!", "entry.trigger is 'Explode!'"),
    ("1.from", "no where", "entry.from is 'no where'"),
    ("1.to", None, "entry.to is None"),
    ("2.release", 1.5, "entry.release is 1.5"),
    ("4.upgrade", "x", "entry.upgrade is 'x'"),
    ("4.upgrade.from", "", "entry.upgrade.from is ''"),
    ("4.upgrade.to", 7, "entry.upgrade.to is 7"),
    ("5.superseded_by", 5, "entry.superseded_by is 5"),
    ("5.skipped", "x", "entry.skipped is 'x'"),
    ("5.skipped", [3], "entry.skipped[0] is 3"),
    ("5.skipped", [{"effect": "Explode!", "error": "e"}],
     "entry.skipped[0].effect is 'Explode!'"),
    ("5.skipped", [{"effect": "close_gate"}], "entry.skipped[0].error is missing"),
]
# Run through the CLI as subprocesses: one of each kind of bad value.
STATE_CLI = ["pending.done=-5", "seq=-1", "pending.effects.1='rm -rf'",
             "upgrade.started=inf", "last_result.outcome='maybe'"]


def _id(field: str, value: Any) -> str:
    return f"{field}={'<gone>' if value is GONE else repr(value)}"


def _subset(cases: list[tuple[str, Any, str]], ids: list[str]) -> list[Any]:
    chosen = [pytest.param(*c, id=_id(c[0], c[1])) for c in cases if _id(c[0], c[1]) in ids]
    assert len(chosen) == len(ids)
    return chosen


def _one_line(message: str, path: Path, needle: str) -> None:
    assert "\n" not in message.strip() and str(path) in message, message
    assert needle in message and "left untouched" in message, message


def _run(world: World, config: Path, *argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "agent_fsm", "--config", str(config),
                             "--root", str(world.root), *argv], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PATH": "/nonexistent"})


COMMANDS = (("status", "--json"), ("status",), ("recover",), ("daemon",), ("doctor", "--json"))


def _cli(world: World, config: Path, path: Path, needle: str,
         commands: tuple[tuple[str, ...], ...] = COMMANDS) -> None:
    """Every command exits 1 with the one line (doctor: a `fail` finding), all run at once."""
    procs = [(argv, _run(world, config, *argv)) for argv in commands]
    for argv, proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 1, (argv, err)
        assert "Traceback" not in err, err
        if argv[0] == "doctor":
            fails = [f["detail"] for f in json.loads(out) if f["level"] == "fail"]
            assert any(needle in f and str(path) in f for f in fails), fails
        else:
            lines = err.strip().splitlines()
            if argv[0] == "daemon":  # its journal says what it did before: one error line
                lines = [line for line in lines if line.startswith("<3>")]
            assert len(lines) == 1 and needle in lines[0] and str(path) in lines[0], (argv, err)


def _paths(value: Any, prefix: str = "") -> Iterator[str]:
    """Every field of a JSON value, list items as one ("history.N.time")."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, f"{prefix}.{k}" if prefix else k)
    elif isinstance(value, list) and value and isinstance(value[0], dict):
        for v in value:
            yield from _paths(v, f"{prefix}.N")
    yield prefix


class TestStateFile:
    def test_every_field_has_a_case(self, rich: World) -> None:
        """Each field of a filled state file (and each argument a transition records) is named
        by the refusal of at least one bad value below."""
        data = json.loads(rich.paths.state_file.read_bytes())
        data["pending"]["args"].update(attempt=1, no_start=False, upgrade={"from": "a", "to": "b"})
        fields = {p for p in _paths(data) if p not in ("", "schema", "checksum")}
        named = {re.sub(r"\[\d+\]", ".N", needle.split(" ")[0]) for _, _, needle in STATE_CASES}
        assert fields - named == set()

    @pytest.mark.parametrize(("field", "value", "needle"), STATE_CASES,
                             ids=[_id(f, v) for f, v, _ in STATE_CASES])
    def test_refused_in_one_line_and_left_untouched(self, rich: World, tmp_path: Path,
                                                    field: str, value: Any, needle: str) -> None:
        """The reader, a transition and doctor all refuse the one bad field by name and value,
        and the file keeps its bytes."""
        world = _copy(rich, tmp_path)
        bad = _mutated_state(world.paths.state_file.read_bytes(), field, value)
        world.paths.state_file.write_bytes(bad)
        with pytest.raises(StateFileError) as err:
            world.node.store.decode(bad)
        _one_line(str(err.value), world.paths.state_file, needle)
        with pytest.raises(StateFileError, match="left untouched"):
            world.node.controller.resume()
        found = [f for f in doctor(world.node, check_systemd=False) if f.check == "state file"]
        assert [(f.level, f.detail) for f in found] == [("fail", str(err.value))]
        assert world.paths.state_file.read_bytes() == bad

    @pytest.mark.parametrize(("field", "value", "needle"), _subset(STATE_CASES, STATE_CLI))
    def test_commands_exit_1_in_one_line(self, rich: World, tmp_path: Path, config: Path,
                                         field: str, value: Any, needle: str) -> None:
        """status --json (the fast path), status, recover and the daemon exit 1 with one line
        naming the field, doctor --json fails on it, and the file keeps its bytes."""
        world = _copy(rich, tmp_path)
        bad = _mutated_state(world.paths.state_file.read_bytes(), field, value)
        world.paths.state_file.write_bytes(bad)
        _cli(world, config, world.paths.state_file, needle)
        assert world.paths.state_file.read_bytes() == bad

    def test_an_indented_file_is_read_the_slow_way(self, rich: World, tmp_path: Path) -> None:
        """An indented file (a hand-edited one: checked the slow way) still reads, and a bad
        field in it is still refused."""
        world = _copy(rich, tmp_path)
        data = json.loads(world.paths.state_file.read_bytes())
        world.paths.state_file.write_text(json.dumps(data, indent=1))
        doc = world.node.store.read()
        assert doc.pending is not None and doc.counters is not None
        assert doc.counters["rollbacks"] == 1
        data.pop("checksum")
        data["pending"]["done"] = 9
        data["checksum"] = checksum(data)
        world.paths.state_file.write_text(json.dumps(data, indent=1))
        with pytest.raises(StateFileError, match=r"pending\.done is 9, expected an integer "
                                                 r"from 0 to 7"):
            world.node.store.read()

    def test_entries_fields_kept_by_some_are_read(self, rich: World, tmp_path: Path) -> None:
        """A history entry may also name the trigger that superseded it and the tolerant
        effects that failed; valid ones are read as they are."""
        world = _copy(rich, tmp_path)
        entry = {**world.node.store.history()[5], "superseded_by": "recover",
                 "skipped": [{"effect": "reset_start_limit", "error": "refused"}]}
        _write_line(world, 5, entry)
        assert world.node.store.history()[5]["superseded_by"] == "recover"
        assert world.node.store.read_journal().damaged == ()

    @pytest.mark.parametrize(("field", "value", "needle"), ENTRY_CASES,
                             ids=[_id(f, v) for f, v, _ in ENTRY_CASES])
    def test_a_bad_journal_entry_is_skipped_and_named(self, rich: World, tmp_path: Path,
                                                      field: str, value: Any,
                                                      needle: str) -> None:
        """A journal line with a right checksum but a bad field is skipped by `history` and
        named, with its line, by `doctor`; the state file is not affected."""
        world = _copy(rich, tmp_path)
        index, _, key = field.partition(".")
        entry = world.node.store.history()[int(index)]
        _set(entry, key, value)
        kept = len(world.node.store.history())
        _write_line(world, int(index), entry)
        read = world.node.store.read_journal()
        assert [d.line for d in read.damaged] == [int(index) + 1]
        assert needle in read.damaged[0].why and len(read.entries) == kept - 1
        found = [f.detail for f in doctor(world.node, check_systemd=False) if f.check == "history"]
        assert len(found) == 1 and f"line {int(index) + 1} {needle}" in found[0], found

    def test_a_store_given_no_names_accepts_any(self, rich: World, tmp_path: Path) -> None:
        """A store built without the machine's triggers and effects (as tests build one) does
        not check those names, but still checks states, types and ranges."""
        from agent_fsm.node.state.store import Store

        world = _copy(rich, tmp_path)
        store = Store(world.paths.state_file, world.paths.lock_file, rich.node.store.states, "idle")
        raw = world.paths.state_file.read_bytes()
        assert store.decode(_mutated_state(raw, "pending.effects.1", "x")).pending is not None
        with pytest.raises(StateFileError, match=r"pending\.done is -1"):
            store.decode(_mutated_state(raw, "pending.done", -1))


SIGNAL_CASES: list[tuple[str, Any, str]] = [
    ("", [1, 2], "the signal is [1, 2]"),
    ("from", "../x", "from is '../x'"),
    ("from", GONE, "from is missing"),
    ("to", 5, "to is 5"),
    ("attempt", 1e400, "attempt is inf"),
    ("attempt", NAN, "attempt is nan"),
    ("attempt", -1, "attempt is -1"),
    ("attempt", 1.5, "attempt is 1.5"),
    ("attempt", True, "attempt is True"),
    ("attempt", 2**53 + 1, f"attempt is {2**53 + 1}"),
    ("started", "x", "started is 'x'"),
    ("started", NAN, "started is nan"),
    ("started", 1e300, "started is 1e+300"),
    ("deadline", -INF, "deadline is -inf"),
    ("deadline", None, "deadline is None"),
    ("kind", "hold", "kind is 'hold', expected 'signal'"),
    ("schema", 2, "schema 2, newer than this agent-fsm understands (1)"),
    ("checksum", "sha256:0", "checksum 'sha256:0', expected 'sha256:"),
]
SIGNAL_CLI = ["attempt=inf", "from=<gone>"]


class TestVersions:
    @pytest.mark.parametrize("text", ["1.0.0", "2.0.0-rc.1+b7", "v_1", "a" * 64, "a" * 65, "",
                                      "..", "1..2", "../x", "-1", ".1", "a/b", "a b", "é"])
    def test_the_release_version_rule(self, text: str) -> None:
        """A version in a file is good exactly when `release add` would accept it."""
        from agent_fsm.errors import ReleaseError
        from agent_fsm.node.releases.pointers import check_version

        try:
            check_version(text)
            good = True
        except ReleaseError:
            good = False
        assert validate._is_version(text) is good
        if good:
            assert validate.version(text, "v") == text
        else:
            with pytest.raises(Invalid, match="expected a release version"):
                validate.version(text, "v")


class TestSignalFile:
    def test_every_field_has_a_case(self, judged: World) -> None:
        """Each field of the signal is named by the refusal of at least one bad value below."""
        fields = set(json.loads(judged.paths.signal_file.read_bytes()))
        assert fields - {needle.split(" ")[0] for _, _, needle in SIGNAL_CASES} == set()

    @pytest.mark.parametrize(("field", "value", "needle"), SIGNAL_CASES,
                             ids=[_id(f, v) for f, v, _ in SIGNAL_CASES])
    def test_refused_in_one_line_and_left_untouched(self, judged: World, tmp_path: Path,
                                                    field: str, value: Any, needle: str) -> None:
        """The reader and doctor refuse the one bad field by name and value, the signal keeps
        its bytes, and `recover` still rolls back: the way back does not need the signal."""
        world = _copy(judged, tmp_path)
        bad = _mutated_signal(world.paths.signal_file.read_bytes(), field, value)
        world.paths.signal_file.write_bytes(bad)
        with pytest.raises(SignalError) as err:
            signal_file.read(world.paths.signal_file)
        _one_line(str(err.value), world.paths.signal_file, needle)
        found = [f for f in doctor(world.node, check_systemd=False) if f.check == "signal"]
        assert [(f.level, f.detail) for f in found] == [("fail", str(err.value))]
        assert world.node.controller.fire("recover").state == "recovering"
        assert world.node.releases.selected() == "1.0.0"
        assert world.paths.signal_file.read_bytes() == bad

    @pytest.mark.parametrize(("field", "value", "needle"), _subset(SIGNAL_CASES, SIGNAL_CLI))
    def test_commands_exit_1_in_one_line(self, judged: World, tmp_path: Path, config: Path,
                                         field: str, value: Any, needle: str) -> None:
        """status --json, status and the daemon exit 1 with one line naming the field,
        doctor --json fails on it, and the signal keeps its bytes (recover rolls back: above)."""
        world = _copy(judged, tmp_path)
        bad = _mutated_signal(world.paths.signal_file.read_bytes(), field, value)
        world.paths.signal_file.write_bytes(bad)
        _cli(world, config, world.paths.signal_file, needle,
             tuple(c for c in COMMANDS if c != ("recover",)))
        assert world.paths.signal_file.read_bytes() == bad


RESULT = Result("1.0.0", "2.0.0", "rolled_back", 10.0, 12.0).to_json()
RESULT_CASES: list[tuple[str, bytes, str]] = [
    ("not json", b'{"from": "1.0.0", "to', "not valid JSON"),
    ("not utf-8", b"\xff\xfe{}", "not valid JSON"),
    ("not an object", b"[]", "the result is []"),
    *[(f"{k}={v!r}", validate.RESULT.encode({**RESULT, k: v}), f"{k} is {v!r}")
      for k, v in (("from", "../x"), ("to", None), ("outcome", "maybe"), ("started", NAN),
                   ("time", -1))],
    ("time missing", validate.RESULT.encode({k: v for k, v in RESULT.items() if k != "time"}),
     "time is missing"),
    ("no kind", json.dumps(RESULT).encode(), "has no kind, expected 'result'"),
]


class TestQueuedResult:
    def test_the_outcomes_read_back_are_the_ones_published(self) -> None:
        """A queued result's outcome is checked against the very outcomes the publisher writes
        (`system.publish.Outcome`; the node's reader keeps its own list beside it)."""
        from typing import get_args

        from agent_fsm.system.publish import Outcome

        assert tuple(validate.OUTCOMES) == get_args(Outcome)

    @pytest.mark.parametrize(("case", "raw", "needle"), RESULT_CASES,
                             ids=[c for c, _, _ in RESULT_CASES])
    def test_not_sent_and_left_queued(self, tmp_path: Path, case: str, raw: bytes,
                                      needle: str) -> None:
        """Delivery refuses a queued result that is not a valid one, in one line naming it and
        the field, before running the command; it stays queued as it was."""
        sent = tmp_path / "sent"
        publisher = RecordPublisher(tmp_path / "results", ("sh", "-c", f"cat >> {sent}"),
                                    outbox=tmp_path / "outbox", document=validate.RESULT)
        entry = tmp_path / "outbox" / "10000-2.0.0.json"
        entry.parent.mkdir()
        entry.write_bytes(raw)
        with pytest.raises(PublishError) as err:
            publisher.deliver()
        message = str(err.value)
        assert "\n" not in message and str(entry) in message and needle in message, message
        assert entry.read_bytes() == raw and not sent.exists()

    def test_doctor_fails_on_it(self, world: World) -> None:
        """doctor names a queued result that delivery would refuse."""
        world.installed("1.0.0")
        world.paths.outbox_dir.mkdir(exist_ok=True)
        entry = world.paths.outbox_dir / "10000-2.0.0.json"
        entry.write_bytes(validate.RESULT.encode({**RESULT, "outcome": "maybe"}))
        found = [f for f in doctor(world.node, check_systemd=False) if f.check == "outbox"]
        assert [f.level for f in found] == ["fail"]
        assert str(entry) in found[0].detail and "outcome is 'maybe'" in found[0].detail
