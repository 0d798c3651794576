"""One configured node: its paths, store, effectors and controller, wired in one place.

This composition root gives the engine its effects and conditions, and gives readers (views,
actions, the daemon) the parts they read (`releases`, `gate`, `signal()`), so none reaches through
the effectors. `open_reader` wires only those, for `status`; `open_node`, for writers, alone imports
the engine, effects, publisher, systemd and the hooks' runner.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from .errors import AssetError
from .machine.definition import Definition
from .machine.hooks import check as check_hooks
from .machine.vocabulary import Groups, count_rules, groups
from .node.config import Config
from .node.paths import Paths
from .node.releases.pointers import Releases
from .node.runtime import signal
from .node.runtime.gate import Gate
from .node.runtime.signal import UpgradeSignal
from .node.state.store import Store
from .system.clock import Clock, SystemClock

if TYPE_CHECKING:  # what writers are given, imported by `open_node` alone
    from .machine.engine import Controller
    from .system.publish import Publisher
    from .system.systemd import Systemd
    from .upgrade.effectors import Effectors
    from .upgrade.roles import Command


class Node(NamedTuple):  # not a dataclass: `status` imports this module (docs/design.md)
    config: Config
    paths: Paths
    effectors: Effectors
    store: Store
    controller: Controller

    @property
    def definition(self) -> Definition:
        return self.controller.definition

    @property
    def groups(self) -> Groups:
        return self.controller.groups

    @property
    def releases(self) -> Releases:
        return self.effectors.releases

    @property
    def gate(self) -> Gate:
        return self.effectors.gate

    @property
    def clock(self) -> Clock:
        return self.effectors.clock

    def signal(self) -> UpgradeSignal | None:
        return self.effectors.signal()

    def keep_settings(self) -> bool:
        """Keep this config, read valid, as the last-good's settings (`kept.refresh`); whether they
        were written.

        Only as root, with the node settled on its last-good (no signal, nothing owed: the code
        running is the last-good's), and with no writer holding the lock (one try, no wait: the next
        read keeps them). DiskError when the disk fails it; the caller goes on and the next read
        tries again.
        """
        import os

        from .node.assets import kept

        if self.config.fallback is not None or os.geteuid() != 0 \
                or not self.paths.last_good_assets.exists():
            return False  # a read-only command of another user, or nothing kept to refresh
        with self.store.locked_if_free() as got:
            if not got:
                return False
            doc = self.store.read()
            last_good = self.releases.last_good()
            if doc.pending is not None or self.signal() is not None or last_good is None \
                    or self.releases.selected() != last_good:
                return False
            try:
                copy = kept.read(self.paths.last_good_assets)
            except AssetError:
                return False  # damaged: left untouched; the next promotion writes it again
            if copy is None or copy.version != last_good:
                return False
            return kept.refresh(self.paths, copy)


class Reader:
    """What a reader of the node's files is given (`status`): config, paths, definition and its
    groups, store, releases and their pointers, gate, clock and signal. The attributes are a
    `Node`'s, and none writes."""

    def __init__(self, config: Config, paths: Paths, definition: Definition,
                 clock: Clock) -> None:
        self.config = config
        self.paths = paths
        self.definition = definition
        self.groups = groups(definition)
        self.store = _store(paths, definition)
        self.releases = Releases(paths)
        self.gate = Gate(paths.gate_file)
        self.clock = clock

    def signal(self) -> UpgradeSignal | None:
        return signal.read(self.paths.signal_file)


def _store(paths: Paths, definition: Definition) -> Store:
    """The state file as this machine reads and writes it: its names and counting rules."""
    return Store(paths.state_file, paths.lock_file, definition.state_names, definition.initial,
                 triggers=[t.trigger for t in definition.transitions],
                 effects=[e.name for t in definition.transitions for e in t.effects],
                 count_rules=count_rules(definition, groups(definition)))


def open_reader(config: Config, root: Path | None = None, *,
                clock: Clock | None = None) -> Reader:
    """Wire the readers' parts of a node (`Reader`). The config is checked as `open_node` checks it,
    hooks included, so a reader refuses what a writer would."""
    from .machine.reading import shipped

    definition = shipped()
    check_hooks(config.hooks, definition, config.source)
    return Reader(config, Paths(config, root), definition,
                  clock if clock is not None else SystemClock())


def open_node(config: Config, root: Path | None = None, *, systemd: Systemd | None = None,
              publisher: Publisher | None = None, clock: Clock | None = None,
              command: Command | None = None, release: str | None = None) -> Node:
    """Wire a node; anything not given is the real implementation. `command`: the process's
    (`upgrade.roles`), whose role the engine checks every transition against; None checks none
    (tests, tools). `release`: the release its code is (default: found as `roles` says)."""
    from .machine.engine import Controller
    from .node.records import hook_failures
    from .node.state import validate
    from .system.hooks import HookRunner
    from .system.publish import RecordPublisher
    from .system.systemd import Systemctl
    from .upgrade.effectors import Effectors
    from .upgrade.registry import CONDITIONS, EFFECTS, load_definition
    from .upgrade.roles import Process

    paths = Paths(config, root)
    definition = load_definition()
    check_hooks(config.hooks, definition, config.source)  # the trigger names it may use
    effectors = Effectors(
        paths,
        systemd if systemd is not None else Systemctl(config.systemctl),
        publisher if publisher is not None else RecordPublisher(
            paths.results_dir, config.publish_command, outbox=paths.outbox_dir,
            document=validate.RESULT),
        clock if clock is not None else SystemClock(),
    )
    store = _store(paths, definition)
    hooks = HookRunner(config.name, config.hooks.before, config.hooks.after,
                       config.hooks.timeout_seconds,
                       noted=lambda key, failed: hook_failures.note(
                           paths.state_dir, key, effectors.clock.now(), failed))
    process = None if command is None else (
        Process(command, release, effectors) if release is not None
        else Process.started(command, effectors))
    controller = Controller(definition, store, effectors, effects=EFFECTS, conditions=CONDITIONS,
                            history_limit=config.history_limit, hooks=hooks, process=process)
    return Node(config, paths, effectors, store, controller)
