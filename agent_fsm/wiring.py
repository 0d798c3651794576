"""One configured node: its paths, store, host and controller, wired together in one place.

This is the composition root: it sits above the lifecycle and the node's files, gives the
engine its effects and conditions, and gives readers (views, actions, the daemon) the parts they
read directly (`releases`, `gate`, `signal()`), so no reader reaches through the effects' host.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .lifecycle.definition import Definition
from .lifecycle.effects import Host
from .lifecycle.engine import Controller
from .lifecycle.hooks import check as check_hooks
from .lifecycle.states import Groups, count_rules, groups
from .lifecycle.table import CONDITIONS, EFFECTS, load_definition
from .node import hook_failures, validate
from .node.config import Config
from .node.gate import Gate
from .node.paths import Paths
from .node.releases import Releases
from .node.signal import UpgradeSignal
from .node.store import Store
from .system.clock import Clock, SystemClock
from .system.hooks import HookRunner
from .system.publish import Publisher, RecordPublisher
from .system.systemd import Systemctl, Systemd


@dataclass(frozen=True)
class Node:
    config: Config
    paths: Paths
    host: Host
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
        return self.host.releases

    @property
    def gate(self) -> Gate:
        return self.host.gate

    @property
    def clock(self) -> Clock:
        return self.host.clock

    def signal(self) -> UpgradeSignal | None:
        return self.host.signal()


def open_node(config: Config, root: Path | None = None, *, systemd: Systemd | None = None,
              publisher: Publisher | None = None, clock: Clock | None = None) -> Node:
    """Wire a node; anything not given is the real implementation."""
    paths = Paths(config, root)
    definition = load_definition()
    check_hooks(config.hooks, definition, config.source)  # the trigger names it may use
    host = Host(
        paths,
        systemd if systemd is not None else Systemctl(config.systemctl),
        publisher if publisher is not None else RecordPublisher(
            paths.results_dir, config.publish_command, outbox=paths.outbox_dir,
            check=validate.result_file),
        clock if clock is not None else SystemClock(),
    )
    store = Store(paths.state_file, paths.lock_file, definition.state_names, definition.initial,
                  triggers=[t.trigger for t in definition.transitions],
                  effects=[e.name for t in definition.transitions for e in t.effects],
                  count_rules=count_rules(definition, groups(definition)))
    hooks = HookRunner(config.name, config.hooks.before, config.hooks.after,
                       config.hooks.timeout_seconds,
                       noted=lambda key, failed: hook_failures.note(
                           paths.state_dir, key, host.clock.now(), failed))
    controller = Controller(definition, store, host, effects=EFFECTS, conditions=CONDITIONS,
                            history_limit=config.history_limit, hooks=hooks)
    return Node(config, paths, host, store, controller)
