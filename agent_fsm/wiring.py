"""One configured node: its paths, store, host and controller, wired together in one place."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .lifecycle.effects import Host
from .lifecycle.engine import Controller, load_definition
from .node.config import Config
from .node.paths import Paths
from .node.store import Store
from .system.clock import Clock, SystemClock
from .system.publish import Publisher, RecordPublisher
from .system.systemd import Systemctl, Systemd


@dataclass(frozen=True)
class Node:
    config: Config
    paths: Paths
    host: Host
    store: Store
    controller: Controller


def open_node(config: Config, root: Path | None = None, *, systemd: Systemd | None = None,
              publisher: Publisher | None = None, clock: Clock | None = None) -> Node:
    """Wire a node; anything not given is the real implementation."""
    paths = Paths(config, root)
    definition = load_definition()
    host = Host(
        paths,
        systemd if systemd is not None else Systemctl(),
        publisher if publisher is not None else RecordPublisher(paths.results_dir,
                                                                config.publish_command),
        clock if clock is not None else SystemClock(),
    )
    store = Store(paths.state_file, paths.lock_file, definition.state_names, definition.initial)
    controller = Controller(definition, store, host, history_limit=config.history_limit)
    return Node(config, paths, host, store, controller)
