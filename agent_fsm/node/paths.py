"""Every path agent-fsm uses, from one place.

Each path has two views: the *host* path, as unit files and scripts name it, and the *real* path,
where agent-fsm writes it. They differ only under `--root DIR`: everything is written below DIR
while units keep host paths, as for an agent in a container writing to its host's filesystem.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from .config import DEFAULT_CONFIG, Config


class Paths(NamedTuple):
    """The host layout for one configured agent, optionally below a root directory."""

    config: Config
    root: Path | None = None

    def real(self, host_path: Path) -> Path:
        """Where a host path is written on this machine (below --root, if given)."""
        if self.root is None:
            return host_path
        return self.root / host_path.relative_to("/")

    # Host paths (as named inside units and scripts) ----------------------------------------
    @property
    def name(self) -> str:
        return self.config.name

    @property
    def agent_unit_name(self) -> str:
        return f"{self.config.name}.service"

    @property
    def recovery_unit_name(self) -> str:
        return f"{self.config.name}-recovery.service"

    @property
    def follow_service_name(self) -> str:
        return f"{self.config.name}-follow.service"

    @property
    def follow_timer_name(self) -> str:
        return f"{self.config.name}-follow.timer"

    @property
    def host_agent_unit(self) -> Path:
        return self.config.unit_dir / self.agent_unit_name

    @property
    def host_recovery_unit(self) -> Path:
        return self.config.unit_dir / self.recovery_unit_name

    @property
    def host_recovery_script(self) -> Path:
        return self.config.lib_dir / f"{self.config.name}-recovery.sh"

    @property
    def host_selected(self) -> Path:
        return self.config.state_dir / "selected"

    @property
    def host_last_good(self) -> Path:
        return self.config.state_dir / "last-good"

    @property
    def host_config(self) -> Path:
        """The config file as the units and the script name it: below --root, the host's path to it
        (the root taken off); elsewhere, the path it was read from."""
        source = self.config.source
        if source is None:
            return DEFAULT_CONFIG
        return self.host_view(source) or source

    def host_view(self, path: Path) -> Path | None:
        """The host's path to `path` if it lies below --root (compared as written, normalized,
        symlinks not followed); else None."""
        if self.root is None:
            return None
        root = Path(os.path.normpath(self.root.absolute()))
        where = Path(os.path.normpath(path.absolute()))
        if not where.is_relative_to(root):
            return None
        return Path("/") / where.relative_to(root)

    # Real paths (where agent-fsm reads and writes) ------------------------------------------
    @property
    def state_dir(self) -> Path:
        return self.real(self.config.state_dir)

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def lock_file(self) -> Path:
        return self.state_dir / "state.lock"

    @property
    def signal_file(self) -> Path:
        return self.state_dir / "upgrade-signal.json"

    @property
    def last_good_assets(self) -> Path:
        """The last-good's rendered assets, kept when it was promoted (see `kept_assets`)."""
        return self.state_dir / "last-good-assets.json"

    @property
    def last_good_python(self) -> Path:
        """The kept settings' `python`, one line: what a release's bin/agent-fsm falls back to."""
        return self.state_dir / "last-good-python"

    @property
    def systemd_file(self) -> Path:
        """The host's systemd version as last asked, with the boot it was asked in (`render`)."""
        return self.state_dir / "systemd.json"

    @property
    def hold_file(self) -> Path:
        """The operator's hold on upgrades (`agent-fsm hold`), if any."""
        return self.state_dir / "hold.json"

    @property
    def known_good_file(self) -> Path:
        """The versions promoted here, and what the way back last did to a damaged last-good."""
        return self.state_dir / "known-good.json"

    @property
    def channel_dir(self) -> Path:
        """What `follow` keeps: its record, the newest root it believes, partial downloads."""
        return self.state_dir / "channel"

    @property
    def channel_root(self) -> Path:
        """The root of trust the config names (the node's first one)."""
        return self.real(self.config.channel.root)

    @property
    def machine_id(self) -> Path:
        return self.real(self.config.channel.machine_id)

    @property
    def known_bad_file(self) -> Path:
        """The versions that rolled back here, and rollbacks by reason class."""
        return self.state_dir / "known-bad.json"

    @property
    def inhibitor_dir(self) -> Path:
        """Where workloads drop the files that inhibit an upgrade."""
        return self.real(self.config.inhibitor_dir)

    @property
    def results_dir(self) -> Path:
        return self.state_dir / "results"

    @property
    def outbox_dir(self) -> Path:
        """Results recorded and not yet delivered by the publish command."""
        return self.state_dir / "outbox"

    @property
    def releases_dir(self) -> Path:
        return self.state_dir / "releases"

    @property
    def selected(self) -> Path:
        return self.real(self.host_selected)

    @property
    def last_good(self) -> Path:
        return self.real(self.host_last_good)

    @property
    def gate_file(self) -> Path:
        return self.real(self.config.run_dir) / "gate"

    @property
    def workload_file(self) -> Path:
        """The daemon's record of the workload it runs (gone with the run dir at every stop)."""
        return self.real(self.config.run_dir) / "workload.json"

    @property
    def agent_unit(self) -> Path:
        return self.real(self.host_agent_unit)

    @property
    def recovery_unit(self) -> Path:
        return self.real(self.host_recovery_unit)

    @property
    def follow_service(self) -> Path:
        return self.real(self.config.unit_dir / self.follow_service_name)

    @property
    def follow_timer(self) -> Path:
        return self.real(self.config.unit_dir / self.follow_timer_name)

    @property
    def recovery_script(self) -> Path:
        return self.real(self.host_recovery_script)
