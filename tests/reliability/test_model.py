"""Model-based: random operations, crashes at random effects, and restarts, checked against a
small reference model and the invariants after every step."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from agent_fsm.errors import Refused
from agent_fsm.node.records import known_bad
from tests.helpers import World, make_world

VERSIONS = ["1.0.0", "2.0.0", "3.0.0", "4.0.0"]
CRASH = st.one_of(st.none(), st.integers(min_value=0, max_value=7))


class Crash(BaseException):
    pass


@dataclass
class Model:
    state: str = "converged"
    selected: str = "1.0.0"
    last_good: str = "1.0.0"
    upgrade: tuple[str, str] | None = None  # (from, to) while a signal exists
    gate: bool = True
    known_bad: frozenset[str] = frozenset()  # rolled back here: refused unless forced


class Lifecycle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="agent-fsm-model-"))
        self.world: World
        self.model = Model()
        self.rendered: dict[str, dict[str, bytes]] = {}

    @initialize()
    def install(self) -> None:
        self.world = make_world(self.tmp / "root")
        for v in VERSIONS:
            self.world.add_release(v)
            self.rendered[v] = self.world.rendered(v)
        self.world.installed("1.0.0")

    def teardown(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    def fire(self, trigger: str, crash_at: int | None, **args: object) -> None:
        """Fire, maybe crashing before effect `crash_at`; a crash is followed by a restart."""
        controller = self.world.node.controller

        def failpoint(t: str, k: int) -> None:
            if t == trigger and k == crash_at:
                raise Crash

        controller.failpoint = failpoint
        try:
            controller.fire(trigger, **args)
        except Crash:
            self.world = self.world.reopen()  # the process died: a new one resumes
            self.world.node.controller.resume()
        finally:
            controller.failpoint = lambda _t, _k: None

    # Operator and daemon operations ---------------------------------------------------------
    @precondition(lambda self: self.model.state == "converged" and self.model.gate)
    @rule(to=st.sampled_from(VERSIONS), crash_at=CRASH, force=st.booleans())
    def upgrade(self, to: str, crash_at: int | None, force: bool) -> None:
        if to == self.model.selected or (to in self.model.known_bad and not force):
            try:
                self.world.node.controller.fire("begin_upgrade", release=to)
            except Refused:
                return
            raise AssertionError(f"an upgrade to {to} (selected or known bad) was not refused")
        self.fire("begin_upgrade", crash_at, release=to, **({"force": True} if force else {}))
        self.fire("candidate_started", None)
        self.model = Model("candidate_running", to, self.model.last_good,
                           (self.model.last_good, to), False, self.model.known_bad)

    @precondition(lambda self: self.model.state == "candidate_running")
    @rule(crash_at=CRASH)
    def judged_ok(self, crash_at: int | None) -> None:
        self.fire("judge_ok", None)
        self.fire("complete", crash_at)
        self.model = Model("converged", self.model.selected, self.model.selected, None, True,
                           self.model.known_bad - {self.model.selected})

    @precondition(lambda self: self.model.state == "candidate_running")
    @rule(crash_at=CRASH)
    def judged_failed(self, crash_at: int | None) -> None:
        self.fire("judge_failed", crash_at)
        self.model.state = "judged_failed"

    @precondition(lambda self: self.model.state in ("candidate_running", "judged_failed",
                                                    "recovering"))
    @rule(crash_at=CRASH)
    def recover(self, crash_at: int | None) -> None:
        self.fire("recover", crash_at)
        assert self.model.upgrade is not None
        self.model.known_bad |= {self.model.upgrade[1]}
        self.model.state, self.model.selected = "recovering", self.model.last_good

    @precondition(lambda self: self.model.state == "recovering")
    @rule(crash_at=CRASH)
    def last_good_back(self, crash_at: int | None) -> None:
        self.fire("recovered", crash_at)
        self.model = Model("converged", self.model.last_good, self.model.last_good, None, True,
                           self.model.known_bad)

    @precondition(lambda self: self.model.state == "converged")
    @rule(to=st.sampled_from(VERSIONS), crash_at=CRASH)
    def activate(self, to: str, crash_at: int | None) -> None:
        self.fire("activate", crash_at, release=to)
        self.model = Model("converged", to, to, None, False, self.model.known_bad)

    @precondition(lambda self: self.model.state == "converged")
    @rule(crash_at=CRASH)
    def settle(self, crash_at: int | None) -> None:
        self.fire("settle", crash_at)
        self.model.gate = True

    @rule()
    def restart(self) -> None:
        self.world = self.world.reopen()
        self.world.node.controller.resume()

    # Invariants -----------------------------------------------------------------------------
    @invariant()
    def matches_model(self) -> None:
        if not hasattr(self, "world"):
            return
        doc = self.world.node.store.read()
        host = self.world.node.effectors
        sig = host.signal()
        assert doc.pending is None
        assert doc.state == self.model.state
        assert host.releases.selected() == self.model.selected
        assert host.releases.last_good() == self.model.last_good
        assert (None if sig is None else (sig.from_version, sig.to_version)) == self.model.upgrade
        assert host.gate.is_open() == self.model.gate
        marks = known_bad.read(self.world.paths.known_bad_file).marks
        assert set(marks) == self.model.known_bad

    @invariant()
    def last_good_assets_never_lost(self) -> None:
        """While an upgrade is pending the assets are the last-good's; otherwise the selected's."""
        if not hasattr(self, "world"):
            return
        owner = self.model.upgrade[0] if self.model.upgrade else self.model.selected
        assert self.world.assets_on_disk() == self.rendered[owner]

    @invariant()
    def gate_never_open_during_an_upgrade(self) -> None:
        if hasattr(self, "world"):
            assert not (self.world.node.effectors.gate.is_open()
                        and self.world.node.effectors.signal() is not None)


Lifecycle.TestCase.settings = settings(max_examples=40, stateful_step_count=25, deadline=None,
                                       suppress_health_check=[HealthCheck.too_slow])
TestLifecycle = Lifecycle.TestCase
