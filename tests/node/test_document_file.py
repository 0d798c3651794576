"""One document format for every file in the state dir: the rules once, on a kind made for the
test, then each kind of file in the state dir, read and written through its own module."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from agent_fsm.actions.releases import origins
from agent_fsm.errors import (
    AssetError,
    DocumentError,
    KnownBadDamaged,
    PublishError,
    ReleaseError,
    SignalError,
    StateFileError,
)
from agent_fsm.node.assets import kept, render
from agent_fsm.node.channel import record as channel_record
from agent_fsm.node.records import hold, hook_failures, known_bad, known_good
from agent_fsm.node.runtime import signal
from agent_fsm.node.state import document_file, store, validate
from agent_fsm.node.state.document_file import Kind, checksum
from agent_fsm.system.publish import RecordPublisher, Result
from tests.helpers import World


def _check(body: dict[str, Any], schema: int) -> None:
    validate.count(body.get("n", validate.MISSING), "n", 10)


TOY = Kind("toy", "toy file", "the toy", 2, _check, 1024, 0o640)


def _refused(kind: Kind, path: Path) -> str:
    """The one line `kind`'s reader refuses `path` with; the file keeps its bytes."""
    before = path.read_bytes()
    with pytest.raises(DocumentError) as err:
        kind.read(path)
    assert path.read_bytes() == before
    message = str(err.value)
    assert "\n" not in message and str(path) in message and "left untouched" in message
    return message


class TestRules:
    def test_every_changed_byte_is_refused_naming_the_file(self, tmp_path: Path) -> None:
        """A document with any one byte changed (a bit flipped, anywhere: a value, a key, the
        checksum, the layout) is refused in one line naming the file, and left untouched."""
        path = tmp_path / "toy.json"
        TOY.write(path, {"n": 3, "note": "é"})
        good = path.read_bytes()
        for i in range(len(good)):
            path.write_bytes(good[:i] + bytes([good[i] ^ 1]) + good[i + 1:])
            _refused(TOY, path)
        path.write_bytes(good.replace(b'"n":3', b'"n":4'))
        assert "has checksum 'sha256:" in _refused(TOY, path)

    def test_a_newer_schema_is_refused_in_one_line(self, tmp_path: Path) -> None:
        """A document of a schema newer than the kind's says so, and to run the newer
        agent-fsm, before looking at its checksum (a later release may sum it otherwise)."""
        path = tmp_path / "toy.json"
        TOY._replace(schema=3).write(path, {"n": 3})
        assert _refused(TOY, path).endswith(
            "has schema 3, newer than this agent-fsm understands (2); it was left untouched; "
            "run the newer agent-fsm that wrote it")
        path.write_bytes(path.read_bytes().replace(b'"n":3', b'"n":4'))
        assert "newer than" in _refused(TOY, path)

    def test_a_field_out_of_range_is_refused_after_the_checksum(self, tmp_path: Path) -> None:
        """A document whose checksum is right but a field is not what the kind's check allows
        is refused naming the field and its value."""
        path = tmp_path / "toy.json"
        TOY.write(path, {"n": 11})
        assert f"toy file {path}: n is 11, expected an integer from 0 to 10;" in _refused(TOY, path)

    @pytest.mark.parametrize(("raw", "says"), [
        (b"", "is empty"), (b"{", "is not valid JSON"), (b"\xff", "is not valid JSON"),
        (b"[1, 2]", "is not a JSON object (the toy is [1, 2])"),
        (b'{"kind": "toy", "schema": 2, "n": 1}', "has no checksum, expected 'sha256:"),
        (b'{"kind": "toy", "n": 1}', "has schema None, expected 2"),
        (b'{"kind": "toy", "schema": true, "n": 1}', "has schema True, expected 2"),
        (b'{"kind": "toy", "schema": 1, "n": 1}', "has schema 1, expected 2"),
        (b'{"schema": 2, "n": 1}', "has no kind, expected 'toy'"),
        (b'{"n": 1}', "has no kind, expected 'toy'"),
    ])
    def test_what_is_not_a_document_is_refused(self, tmp_path: Path, raw: bytes,
                                               says: str) -> None:
        """Bytes that are no JSON object, and a document without its kind, its checksum or its
        schema, or of an older schema than its kind's, are refused saying what is wrong."""
        path = tmp_path / "toy.json"
        path.write_bytes(raw)
        assert says in _refused(TOY, path)

    def test_a_document_of_another_kind_is_refused(self, tmp_path: Path) -> None:
        """A valid document of another kind (a file copied to the wrong name) is refused."""
        path = tmp_path / "toy.json"
        TOY._replace(name="hold").write(path, {"n": 1})
        assert ": kind is 'hold', expected 'toy';" in _refused(TOY, path)

    def test_a_signed_file_without_its_kind_is_refused(self, tmp_path: Path) -> None:
        """A file whose checksum is right but that carries no `kind` is refused, as is one
        whose checksum no longer matches its fields."""
        path = tmp_path / "toy.json"
        body = {"schema": 2, "n": 3}
        path.write_text(json.dumps({**body, "checksum": checksum(body)}, indent=1))
        assert "has no kind, expected 'toy'" in _refused(TOY, path)
        tagged = {**body, "kind": "toy"}
        path.write_text(json.dumps({**tagged, "checksum": checksum(tagged)}, indent=1))
        assert TOY.read(path) == {"n": 3}
        path.write_text(json.dumps({**tagged, "n": 4, "checksum": checksum(tagged)}, indent=1))
        assert "has checksum" in _refused(TOY, path)

    def test_the_same_body_always_gives_the_same_bytes(self) -> None:
        """Whatever order a body's tables were built in, it encodes to the same bytes (the
        canonical JSON with the checksum first), and another value to other bytes."""
        one = TOY.encode({"n": 1, "t": {"a": 1, "b": [1.5, None]}})
        assert TOY.encode({"t": {"b": [1.5, None], "a": 1}, "n": 1}) == one
        assert one.startswith(b'{"checksum":"sha256:') and one.endswith(b"}\n")
        assert one.count(b"\n") == 1 and TOY.encode({"n": 2, "t": {"a": 1, "b": [1.5, None]}}) != one

    def test_reads_no_symlink_nor_too_much_and_writes_the_mode(self, tmp_path: Path) -> None:
        """A missing file is None; a symlink or a file over the kind's limit is refused, not
        read; a write has the kind's mode, or the one asked for."""
        path = tmp_path / "toy.json"
        assert TOY.read(path) is None
        TOY.write(path, {"n": 1})
        assert path.stat().st_mode & 0o777 == 0o640
        TOY.write(path, {"n": 1}, 0o600)
        assert path.stat().st_mode & 0o777 == 0o600
        link = tmp_path / "link.json"
        link.symlink_to(path)
        assert "cannot be read: it is a symlink" in _refused(TOY, link)
        path.write_text(json.dumps({"n": 1, "pad": "x" * 1024}))
        assert "cannot be read: it is larger than 1024 bytes" in _refused(TOY, path)


# Each kind of file in the state dir, through its own module ----------------------------------
RESULT = Result("1.0.0", "2.0.0", "rolled_back", 10.0, 20.0, "stopped while being judged",
                "stopped")
SIGNAL = signal.UpgradeSignal("1.0.0", "2.0.0", 1, 10.0, 70.0)
MARK = known_bad.Mark("2.0.0", 20.0, "the workload crashed", "crashed", 10.0)
IMAGE = origins.Image("oci-archive:/srv/a.tar", "sha256:" + "a" * 64, "", True)


def _publisher(w: World, command: tuple[str, ...] = ()) -> RecordPublisher:
    return RecordPublisher(w.paths.results_dir, command, outbox=w.paths.outbox_dir,
                           document=validate.RESULT)


def _raises(error: type[Exception], read: Callable[[], object]) -> str:
    with pytest.raises(error) as err:
        read()
    return str(err.value)


def _dumps(data: Any, indent: int = 2) -> bytes:
    return (json.dumps(data, indent=indent) + "\n").encode()


def _deliver_refused(w: World) -> str:
    sent = w.root / "sent"
    message = _raises(PublishError, _publisher(w, ("sh", "-c", f"cat > {sent}")).deliver)
    assert not sent.exists()
    return message


class Case(NamedTuple):
    kind: Kind
    path: Callable[[World], Path]
    write: Callable[[World], object]  # its module writes the file
    refused: Callable[[World], str]  # its readers on a damaged file: the line they show


CASES = {
    "state": Case(store.KIND, lambda w: w.paths.state_file, lambda w: None,
                  lambda w: _raises(StateFileError, w.node.store.read)),
    "signal": Case(signal.KIND, lambda w: w.paths.signal_file,
                   lambda w: signal.write(w.paths.signal_file, SIGNAL),
                   lambda w: _raises(SignalError, lambda: signal.read(w.paths.signal_file))),
    "hold": Case(hold.KIND, lambda w: w.paths.hold_file,
                 lambda w: hold.write(w.paths.hold_file, hold.Hold("batch", 10.0, None)),
                 # a damaged hold still holds, naming the file
                 lambda w: (hold.read(w.paths.hold_file) or hold.Hold("", 0, 0)).error or ""),
    "known-bad": Case(known_bad.KIND, lambda w: w.paths.known_bad_file,
                      lambda w: known_bad.mark(w.paths.known_bad_file, MARK),
                      lambda w: _raises(KnownBadDamaged,
                                        lambda: known_bad.read(w.paths.known_bad_file))),
    # a damaged record is read as empty (no fallback known): the way back never stops on it
    "known-good": Case(known_good.KIND, lambda w: w.paths.known_good_file,
                       lambda w: known_good.promoted(w.paths.known_good_file, "1.0.0", 10.0),
                       lambda w: "" if known_good.read_or_empty(
                           w.paths.known_good_file).versions == {} else "read"),
    # a damaged record is read as none (the next write replaces it): `status` shows no failure
    "hook-failures": Case(hook_failures.KIND,
                          lambda w: w.paths.state_dir / hook_failures.FILE_NAME,
                          lambda w: hook_failures.note(w.paths.state_dir, "after.complete", 20.0,
                                                       "hook exited 1"),
                          lambda w: "" if hook_failures.read(w.paths.state_dir) == {} else "read"),
    "kept-assets": Case(kept.KIND, lambda w: w.paths.last_good_assets, lambda w: None,
                        lambda w: _raises(AssetError,
                                          lambda: kept.read(w.paths.last_good_assets))),
    # unreadable, it is read as unknown (the unit rendered for the oldest systemd), and asked again
    "systemd": Case(render.SYSTEMD_KIND, lambda w: w.paths.systemd_file,
                    lambda w: render.remember_systemd_version(w.paths, 257),
                    lambda w: "" if render.systemd_version(w.paths) is None else "read"),
    "result": Case(validate.RESULT, lambda w: w.paths.outbox_dir / "10000-2.0.0.json",
                   lambda w: _publisher(w).record(RESULT), _deliver_refused),
    "image-record": Case(origins.KIND, lambda w: w.paths.releases_dir / ".images" / "2.0.0",
                         lambda w: origins.write(w.node, "2.0.0", (IMAGE,)),
                         lambda w: _raises(ReleaseError, lambda: origins.read(w.node, "2.0.0"))),
    # a damaged channel record stops `follow` (the index version seen is not known)
    "channel": Case(channel_record.KIND, lambda w: w.paths.channel_dir / "follow.json",
                    lambda w: channel_record.write(w.paths.channel_dir, channel_record.Record(
                        10.0, channel_record.Outcome.up_to_date, "up to date", 1,
                        channel_record.Seen(3, "sha256:" + "0" * 64))),
                    lambda w: _raises(DocumentError,
                                      lambda: channel_record.read(w.paths.channel_dir))),
}


@pytest.fixture
def node(world: World) -> World:
    """Installed on 1.0.0: the state file and the kept assets written."""
    return world.installed("1.0.0")


class TestEveryKind:
    def test_the_modules_docstring_lists_every_kind(self) -> None:
        """document_file's table names each kind with the schema it writes."""
        rows = dict(re.findall(r"\| `([a-z-]+)` +\| (\d+) ", document_file.__doc__ or ""))
        assert rows == {name: str(c.kind.schema) for name, c in CASES.items()}
        assert all(c.kind.name == name for name, c in CASES.items())

    @pytest.mark.parametrize("name", list(CASES))
    def test_its_file_is_a_document_and_a_changed_byte_is_refused(self, node: World,
                                                                  name: str) -> None:
        """The file its module writes is a document of its kind; with one byte changed (of its
        checksum) its readers refuse it, or report it as their own rules say, naming the file,
        and leave it untouched."""
        case = CASES[name]
        case.write(node)
        path = case.path(node)
        raw = path.read_bytes()
        assert raw.startswith(b'{"checksum":"sha256:') and raw.count(b"\n") == 1
        assert json.loads(raw)["kind"] == name and case.kind.read(path) is not None
        at = len(b'{"checksum":"sha256:')
        damaged = raw[:at] + (b"1" if raw[at:at + 1] == b"0" else b"0") + raw[at + 1:]
        path.write_bytes(damaged)
        said = case.refused(node)
        assert path.read_bytes() == damaged
        if name not in ("hook-failures", "systemd", "known-good"):  # read as none
            assert str(path) in said and "checksum" in said and "\n" not in said, said

    @pytest.mark.parametrize("name", list(CASES))
    def test_its_file_without_its_kind_is_refused_and_left_as_it_is(self, node: World,
                                                                    name: str) -> None:
        """Its module's file with `kind` taken out (the checksum made right again) is refused
        in one line and left as it is."""
        case = CASES[name]
        case.write(node)
        path = case.path(node)
        data = json.loads(path.read_bytes())
        del data["kind"], data["checksum"]
        path.write_text(json.dumps({**data, "checksum": checksum(data)}, indent=1))
        assert "has no kind" in _refused(case.kind, path)

    def test_every_file_in_a_used_state_dir_is_a_document(self, node: World) -> None:
        """After an upgrade rolled back, with every kind written, each file in the state dir is
        a document of a known kind (but for the journal, the locks, the pointers, the release
        store's own records and the launcher's one-line `last-good-python`, which a shell reads)."""
        node.upgrading("2.0.0")
        node.node.controller.fire("judge_failed")
        node.node.controller.fire("recover")
        node.node.controller.fire("recovered")
        for case in CASES.values():
            case.write(node)
        kinds = {c.kind.name: c.kind for c in CASES.values()}
        state_dir = node.paths.state_dir
        releases = node.paths.releases_dir
        seen = set()
        for path in sorted(state_dir.rglob("*")):
            if path.is_symlink() or path.is_dir() or path.suffix == ".lock" \
                    or path.name == "history.jsonl" or path == node.paths.last_good_python \
                    or (path.is_relative_to(releases) and (
                        path.parent.name in (".digests", ".hashed")
                        or path.relative_to(releases).parts[0] != ".images")):
                continue
            data = json.loads(path.read_bytes())
            kind = kinds[data["kind"]]
            assert kind.read(path) is not None
            seen.add(kind.name)
        assert seen == set(kinds)

    def test_the_publish_command_gets_the_bare_result(self, node: World) -> None:
        """The publish command's stdin is the bare result (no `kind`, `schema`, `checksum`),
        though the queued copy is a document."""
        sink = node.root / "sink"
        publisher = _publisher(node, ("sh", "-c", f"cat >> {sink}"))
        publisher.record(RESULT)
        assert publisher.deliver() == 1 and sink.read_bytes() == _dumps(RESULT.to_json())
        assert json.loads(publisher.record_path(RESULT).read_bytes())["kind"] == "result"
