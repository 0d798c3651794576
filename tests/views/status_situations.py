"""Nodes in the situations `status` reports, each built through real transitions and the writers'
own functions, for the tests that compare what the lean and full `status --json` print."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agent_fsm.actions import holds
from agent_fsm.actions.recover import recover
from agent_fsm.node import config as config_mod
from agent_fsm.node.records import hook_failures
from agent_fsm.node.state.store import Pending
from tests.helpers import World, make_world

CONFIG = ('name = "agent"\n[judgment]\ndeadline_seconds = 60\nsoak_seconds = 5\n'
          '[hooks.after]\ncomplete = ["/usr/local/sbin/undrain", "--now"]\n')
BROKEN_UNIT = "[Unit]\nDescription=broken ${name}\n"


def _converged(w: World) -> None:
    w.installed("1.0.0")
    w.add_release("2.0.0")


def _pending(w: World) -> None:
    w.installed("1.0.0").upgrading("2.0.0", agent_unit=BROKEN_UNIT)


def _judged_failed(w: World) -> None:
    w.installed("1.0.0").upgrading("2.0.0")
    w.node.controller.fire("judge_failed", reason="checks still failing at the deadline",
                           reason_class="check_failed")


def _rolled_back(w: World) -> None:
    """Back on 1.0.0 after 2.0.0 failed its checks: a rolled-back result and a known-bad mark."""
    _judged_failed(w)
    recover(w.node)
    w.node.controller.fire("recovered")


def _held(w: World) -> None:
    w.installed("1.0.0")
    holds.hold(w.node, "change freeze", until=None)


def _inhibited(w: World) -> None:
    w.installed("1.0.0")
    where = w.paths.inhibitor_dir
    where.mkdir(parents=True)
    (where / "backup").write_text("reason=nightly backup\n")
    (where / "garbled").write_text("no equals sign here\n")


def _hook_failed(w: World) -> None:
    w.installed("1.0.0")
    hook_failures.note(w.paths.state_dir, "after.complete", w.clock.now(),
                       "/usr/local/sbin/undrain --now: exit 1: the load balancer said no")


def _owed(w: World) -> None:
    w.installed("1.0.0")
    doc = w.node.store.read()
    doc.pending = Pending("settle", "converged", "converged",
                          ["converge_assets", "reload_systemd_if_changed", "open_gate"], 1, {}, 0.0)
    w.node.store.write(doc)


def _damaged_known_bad(w: World) -> None:
    _rolled_back(w)
    w.paths.known_bad_file.write_text("{not json")


def _damaged_state(w: World) -> None:
    w.installed("1.0.0")
    w.paths.state_file.write_bytes(w.paths.state_file.read_bytes().replace(b"converged", b"idle", 1))


def _damaged_signal(w: World) -> None:
    w.installed("1.0.0").upgrading("2.0.0")
    w.paths.signal_file.write_text("{")


SITUATIONS: dict[str, Callable[[World], None]] = {
    "nothing installed": lambda w: None,
    "converged": _converged,
    "pending upgrade": _pending,
    "judged failed": _judged_failed,
    "rolled back": _rolled_back,
    "held": _held,
    "inhibited": _inhibited,
    "hook failed": _hook_failed,
    "owed effects": _owed,
    "damaged known-bad record": _damaged_known_bad,
    "damaged state file": _damaged_state,
    "damaged signal": _damaged_signal,
    "hook for an unknown trigger": lambda w: None,
}
# What the config says in each situation, where it is not CONFIG.
CONFIGS = {"hook for an unknown trigger": CONFIG + 'no_such_trigger = ["/bin/true"]\n'}


def build(base: Path, situation: str) -> tuple[Path, Path]:
    """A node below base/root in `situation`, and its config file (base/config.toml)."""
    cfg = base / "config.toml"
    base.mkdir(parents=True, exist_ok=True)
    cfg.write_text(CONFIG)
    world = make_world(base / "root", config_mod.load(cfg))
    SITUATIONS[situation](world)
    cfg.write_text(CONFIGS.get(situation, CONFIG))
    return cfg, world.root
