"""A state file a later agent-fsm wrote (the candidate is by construction newer code than the
last-good) is read well enough to roll back: a later schema through its declared compatible core,
keys this version does not know kept on every rewrite, an owed transition of the candidate's path
with names it does not know superseded by recovery and recorded so, and history entries with
such names shown; a damaged file is still refused and left untouched."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent_fsm.actions.recover import recover
from agent_fsm.errors import StateFileError
from agent_fsm.node.state import store as store_mod
from agent_fsm.views.status.report import status
from tests.helpers import World, make_world


def _world(tmp_path: Path) -> World:
    world = make_world(tmp_path / "root")
    world.installed("1.0.0")
    return world


def _body(world: World) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(world.paths.state_file.read_bytes())
    for key in ("checksum", "kind", "schema"):
        body.pop(key)
    return body


def _write_as_later(world: World, body: dict[str, Any], schema: int = 3,
                    core: int | None = 2) -> bytes:
    """Write the state file as a later agent-fsm of `schema` would, declaring `core`."""
    kind = store_mod.KIND._replace(schema=schema)
    raw = kind.encode({**body, **({} if core is None else {"core": core})})
    world.paths.state_file.write_bytes(raw)
    return raw


LATER_PENDING = {  # a transition of the candidate's path only a later agent-fsm knows
    "unknown trigger": {"trigger": "judge_slowly", "dest": "candidate_running",
                        "effects": ["close_gate", "note_progress"]},
    "unknown effect": {"trigger": "candidate_started", "dest": "candidate_running",
                       "effects": ["close_gate", "hold_assets", "count_attempt", "log_v3"]},
    "unknown state": {"trigger": "candidate_started", "dest": "soaking",
                      "effects": ["close_gate", "hold_assets", "count_attempt"]},
    # superseded for its unknown effect alone: `recover` does not declare `judge_ok`
    "unknown effect, undeclared trigger": {"trigger": "judge_ok", "dest": "judged_ok",
                                           "effects": ["note_verdict"]},
}


class TestSchema:
    def test_a_later_schema_is_read_through_its_core(self, tmp_path: Path) -> None:
        """A file of schema 3 declaring core 2 is read by this (schema 2) agent-fsm as it
        reads its own, its later keys kept aside."""
        world = _world(tmp_path)
        body = {**_body(world), "judgment_phase": {"soaking": True}}
        _write_as_later(world, body)
        doc = world.node.store.read()
        assert (doc.state, doc.extra) == ("converged", {"judgment_phase": {"soaking": True}})

    @pytest.mark.parametrize(("schema", "core"), [(3, None), (4, 3)],
                             ids=["no core", "a core this agent-fsm does not read"])
    def test_a_later_schema_without_a_core_it_reads_is_refused(
            self, tmp_path: Path, schema: int, core: int | None) -> None:
        """Without a core this agent-fsm reads, a later file is refused as newer, saying to run
        the agent-fsm that wrote it, and left untouched."""
        world = _world(tmp_path)
        raw = _write_as_later(world, _body(world), schema, core)
        with pytest.raises(StateFileError, match=f"has schema {schema}, newer than this "
                           "agent-fsm understands .*run the newer agent-fsm that wrote it"):
            world.node.store.read()
        assert world.paths.state_file.read_bytes() == raw

    def test_a_damaged_later_file_is_refused_untouched(self, tmp_path: Path) -> None:
        """A later file with a core but a wrong checksum is refused as damaged (the core keeps
        the checksum), by `recover` too, and nothing overwrites it."""
        world = _world(tmp_path)
        world.upgrading("2.0.0")
        raw = _write_as_later(world, _body(world)).replace(b'"candidate_running"', b'"idle"', 1)
        world.paths.state_file.write_bytes(raw)
        with pytest.raises(StateFileError, match="has checksum"):
            recover(world.reopen().node)
        assert world.paths.state_file.read_bytes() == raw

    def test_a_state_outside_the_core_is_refused(self, tmp_path: Path) -> None:
        """`state` must be one of this agent-fsm's (the core's): a later state there is refused,
        naming it, and the file is left untouched."""
        world = _world(tmp_path)
        raw = _write_as_later(world, {**_body(world), "state": "soaking"})
        with pytest.raises(StateFileError, match="names unknown state 'soaking'"):
            world.node.store.read()
        assert world.paths.state_file.read_bytes() == raw


class TestRewrite:
    def test_keys_it_does_not_know_survive_a_transition(self, tmp_path: Path) -> None:
        """Keys only a later agent-fsm knows (at the top, in `upgrade`, in `counters`) are in
        the file again after this one rewrote it with a transition of its own."""
        world = _world(tmp_path)
        world.upgrading("2.0.0")
        body = _body(world)
        body["judgment_phase"] = {"soaking": True}
        body["upgrade"]["via"] = "beta"  # `channel` is a key of this version
        body["counters"]["slow_judgments"] = 4
        _write_as_later(world, body)
        world = world.reopen()
        world.node.controller.fire("judge_failed", reason="check failed")
        after = _body(world)
        assert after["state"] == "judged_failed"
        assert after["judgment_phase"] == {"soaking": True}
        assert after["upgrade"]["via"] == "beta"
        assert after["counters"]["slow_judgments"] == 4


class TestOwedByALaterVersion:
    @pytest.mark.parametrize("owed", sorted(LATER_PENDING))
    def test_recover_supersedes_it_and_rolls_back(self, tmp_path: Path, owed: str) -> None:
        """Mid-upgrade, a transition the candidate (a later agent-fsm) left owed with names
        this one does not know is shown by `status` as such, superseded by `recover`, recorded
        so in the history, and the node rolls back to the last-good."""
        world = _world(tmp_path)
        world.upgrading("2.0.0")
        body = _body(world)
        body["pending"] = {**LATER_PENDING[owed], "source": "candidate_running", "done": 0,
                           "args": {"started": 5.0}, "started": 5.0, "phase": "v3"}
        _write_as_later(world, body)
        world = world.reopen()
        st = status(world.node)
        assert st.owed is not None and st.owed["unknown"]
        assert "this one never runs it; the way back (`recover`) supersedes it" in st.next.summary
        done = recover(world.node)
        assert done.state == "recovering" and world.node.releases.selected() == "1.0.0"
        entry = next(e for e in world.node.store.history() if e.get("superseded_by"))
        assert entry["trigger"] == LATER_PENDING[owed]["trigger"]
        assert entry["superseded_by"] == "recover" and entry["unknown"]
        assert entry["from"] == entry["to"] == "candidate_running"
        assert world.node.store.read().pending is None

    def test_anything_else_refuses_to_finish_it(self, tmp_path: Path) -> None:
        """Off the way back (converged), a start or an operation refuses to run what it does
        not know, in one line naming the unknown names, and leaves the file untouched."""
        world = _world(tmp_path)
        body = _body(world)
        body["pending"] = {"trigger": "settle_v3", "source": "converged", "dest": "converged",
                           "effects": ["retune"], "done": 0, "args": {"started": 5.0},
                           "started": 5.0}
        raw = _write_as_later(world, body)
        world = world.reopen()
        with pytest.raises(StateFileError, match=r"owes settle_v3 .* trigger settle_v3, effect "
                           r"retune unknown here, so this one cannot finish it"):
            world.node.controller.fire("settle")
        assert world.paths.state_file.read_bytes() == raw

    def test_an_owed_unknown_state_is_refused(self, tmp_path: Path) -> None:
        """An owed transition of known trigger and effects whose destination is a state this
        agent-fsm does not know is refused, naming the state, and the file is left untouched."""
        world = _world(tmp_path)
        body = _body(world)
        body["pending"] = {"trigger": "settle", "source": "converged", "dest": "soaking",
                           "effects": ["open_gate"], "done": 0, "args": {"started": 5.0},
                           "started": 5.0}
        raw = _write_as_later(world, body)
        world = world.reopen()
        with pytest.raises(StateFileError, match=r"owes settle \(converged -> soaking\).* state "
                           r"soaking unknown here, so this one cannot finish it"):
            world.node.controller.fire("settle")
        assert world.paths.state_file.read_bytes() == raw
        assert world.node.store.read().state == "converged"

    def test_a_name_must_still_be_a_name(self, tmp_path: Path) -> None:
        """An owed effect that is no name at all is refused as a field, as before."""
        world = _world(tmp_path)
        body = _body(world)
        body["pending"] = {"trigger": "settle", "source": "converged", "dest": "converged",
                           "effects": ["Rm -rf /"], "done": 0, "args": {"started": 5.0},
                           "started": 5.0}
        _write_as_later(world, body, 2, None)
        with pytest.raises(StateFileError, match=r"pending.effects\[0\] is 'Rm -rf /'"):
            world.node.store.read()
