"""The service assets: the agent unit, the recovery unit and the recovery script.

Each release carries their templates (`assets/`), rendered for this host and written one of
three ways: hold (write only missing files, from the last-good's kept copy, since during an
upgrade the disk holds the only way back), converge (rewrite those that differ), or write all.
Every value goes through `quoted` (`quoting`), so no host value can add a line, a setting or a
command.

The agent unit is rendered for the host's systemd version, asked once a boot and kept in
`systemd.json`: `RestartSteps=` and its kin exist from 254, and older versions warn about them.
An unknown version renders as the oldest. A comment line (`GROWTH_MARKER`), not a placeholder,
marks the place, so older agent-fsms still render newer templates.

`WORKLOAD_MARKER` places the workload's settings from the host config: `ReadWritePaths=`, and
the releases bound read-only at `<run_dir>/releases` for a workload of another user. They take
effect when the unit is next written and started, never while an upgrade holds it.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import NamedTuple

from ... import files
from ...errors import AssetError, DocumentError
from ..paths import Paths
from ..quoting import shell_word, unit_path, unit_token, unit_word
from ..state import validate
from ..state.document_file import Kind

UNIT_MODE = 0o644
SCRIPT_MODE = 0o755
TEMPLATES = ("agent.service", "recovery.service", "recovery.sh")

# The restart policy of a converged agent (docs/systemd.md, "Start limits"): restarted for ever,
# the delay growing from RestartSec= to RESTART_MAX_DELAY over RESTART_STEPS restarts (about
# doubling each time from 1 s), where systemd can (RESTART_GROWTH_SINCE); a constant
# RestartSec= before that.
RESTART_GROWTH_SINCE = 254
RESTART_MAX_DELAY = 60.0
RESTART_STEPS = 6
GROWTH_MARKER = "# agent-fsm: growing restart delays, for the systemd that runs this unit\n"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
WORKLOAD_MARKER = ("# agent-fsm: the workload's view of the releases and its writable paths "
                   "(host config [workload])\n")
RELEASES_VIEW = "releases"  # below run_dir: the releases as the workload sees them


def _systemd_body(body: dict[str, object], _schema: int) -> None:
    validate.count(body.get("version", validate.MISSING), "version")
    if not isinstance(body.get("boot_id"), str):
        raise validate.invalid("boot_id", body.get("boot_id", validate.MISSING), "a string")


SYSTEMD_KIND = Kind("systemd", "systemd version file", "the systemd version", 1, _systemd_body,
                    4 << 10, 0o644)


def boot_id() -> str:
    """This boot's id (the kernel's), empty when it cannot be read."""
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


def systemd_version(paths: Paths) -> int | None:
    """The host's systemd version as asked in this boot; None when not asked or unreadable."""
    try:
        body = SYSTEMD_KIND.read(paths.systemd_file)
    except DocumentError:
        return None
    if body is None or body["boot_id"] != boot_id():
        return None
    return int(body["version"])


def remember_systemd_version(paths: Paths, version: int) -> None:
    """Keep the version systemctl reported, for this boot. DiskError if it cannot be written."""
    SYSTEMD_KIND.write(paths.systemd_file, {"version": version, "boot_id": boot_id()})


def _seconds(value: float) -> str:
    """Seconds to the microsecond systemd counts in, written as given: 1 stays "1"."""
    return f"{value:.6f}".rstrip("0").rstrip(".")


def restart_growth(systemd: int | None, restart_seconds: float) -> str:
    """The agent unit's lines after `RestartSec=` for this systemd.

    Growing delays and `RestartMode=direct` where it has them, else a comment saying why not.
    """
    if systemd is None or systemd < RESTART_GROWTH_SINCE:
        which = "of unknown version" if systemd is None else str(systemd)
        return (f"# systemd {which}: RestartSteps=, RestartMaxDelaySec= and RestartMode= need "
                f"{RESTART_GROWTH_SINCE}; every restart waits RestartSec=.")
    lines = []
    if restart_seconds < RESTART_MAX_DELAY:
        lines += [f"RestartSteps={RESTART_STEPS}", f"RestartMaxDelaySec={_seconds(RESTART_MAX_DELAY)}"]
    # An automatic restart is not a failure: OnFailure= (recovery) only when the unit fails.
    lines.append("RestartMode=direct")
    return "\n".join(lines)


def workload_lines(paths: Paths) -> str:
    """The agent unit's lines for the workload: the releases bound read-only, then `ReadWritePaths=`.

    A missing writable path ("-") is skipped rather than failing the start.
    """
    config = paths.config
    releases = str(config.state_dir / "releases")
    lines = []
    if ":" in releases:  # BindReadOnlyPaths= splits source and target at ':'
        lines.append(f"# the releases are not bound below {config.run_dir}: their path has ':'")
    else:
        lines.append(f"BindReadOnlyPaths=-{unit_path(releases)}:"
                     f"{unit_path(str(config.run_dir / RELEASES_VIEW))}")
    if config.workload.writable_paths:
        lines.append("ReadWritePaths=" + " ".join(
            f"-{unit_path(str(p))}" for p in config.workload.writable_paths))
    return "\n".join(lines)


class Asset(NamedTuple):
    host_path: Path  # as systemd and the units name it
    path: Path  # where it is written (below --root, if any)
    mode: int
    content: bytes

    def on_disk(self) -> bytes | None:
        return files.read_bytes(self.path)

    def matches_disk(self) -> bool:
        return self.on_disk() == self.content


def variables(paths: Paths, version: str, systemd: int | None = None) -> dict[str, str]:
    """The names a template may use: host values as they are, and the unit for `systemd` (None: oldest)."""
    judgment = paths.config.judgment
    # The unit's start timeout bounds the whole judgment: deadline plus soak plus a margin for
    # resuming owed effects and writing the assets.
    timeout = int(judgment.deadline_seconds + judgment.soak_seconds + 10)
    return {
        "name": paths.name,
        "version": version,
        "config": str(paths.host_config),
        "state_dir": str(paths.config.state_dir),
        "lib_dir": str(paths.config.lib_dir),
        "unit_dir": str(paths.config.unit_dir),
        "run_dir": str(paths.config.run_dir),
        "runtime_directory": str(paths.config.run_dir.relative_to("/run")),
        "selected": str(paths.host_selected),
        "last_good": str(paths.host_last_good),
        "agent_unit": paths.agent_unit_name,
        "recovery_unit": paths.recovery_unit_name,
        "recovery_script": str(paths.host_recovery_script),
        "timeout_start_sec": str(timeout),
        # A candidate's starts are counted by the last-good's `start-check` (ExecStartPre=),
        # which starts recovery once max_attempts are used up (older templates: StartLimitBurst=).
        "max_attempts": str(judgment.max_attempts),
        "restart_sec": _seconds(judgment.restart_seconds),
        "restart_growth": restart_growth(systemd, judgment.restart_seconds),
    }


# How each value is written into a unit (see `quoting`): names and numbers as plain tokens, the
# config file as one ExecStart= argument, every other value a path. The script quotes them all
# as shell words.
_UNIT_TOKENS = {"name", "version", "agent_unit", "recovery_unit", "timeout_start_sec",
                "max_attempts", "restart_sec"}
_UNIT_WORDS = {"config"}
_RAW = {"restart_growth"}  # lines `restart_growth` writes from numbers alone (not quoted)


def quoted(values: dict[str, str], template_name: str) -> dict[str, str]:
    """`values` as written into `template_name`; AssetError, naming the value, if one cannot be."""
    out = {}
    for key, value in values.items():
        if key in _RAW:
            out[key] = value if not template_name.endswith(".sh") else ""
            continue
        if template_name.endswith(".sh"):
            quote = shell_word
        else:
            quote = (unit_token if key in _UNIT_TOKENS else
                     unit_word if key in _UNIT_WORDS else unit_path)
        try:
            out[key] = quote(value)
        except ValueError as exc:
            raise AssetError(f"cannot write `{key}` into {template_name}: {exc}; change it in "
                             "the config") from None
    return out


def targets(paths: Paths) -> dict[str, tuple[Path, Path, int]]:
    """Each template's asset on this host: its host path, where it is written, and its mode."""
    return {
        "agent.service": (paths.host_agent_unit, paths.agent_unit, UNIT_MODE),
        "recovery.service": (paths.host_recovery_unit, paths.recovery_unit, UNIT_MODE),
        "recovery.sh": (paths.host_recovery_script, paths.recovery_script, SCRIPT_MODE),
    }


def render(release_dir: Path, paths: Paths, version: str) -> tuple[Asset, ...]:
    """Render a release's asset templates for this host and its systemd, in the order of TEMPLATES."""
    where = targets(paths)
    values = variables(paths, version, systemd_version(paths))
    out: list[Asset] = []
    for template_name in TEMPLATES:
        template_path = release_dir / "assets" / template_name
        try:
            text = template_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise AssetError(
                f"release {version} has no readable template {template_path}: {exc}"
            ) from None
        try:
            content = string.Template(text).substitute(quoted(values, template_name))
        except (KeyError, ValueError) as exc:
            raise AssetError(
                f"template {template_path} of release {version} uses an unknown or malformed "
                f"placeholder ({exc}); known: {', '.join(sorted(values))}"
            ) from None
        if template_name == "agent.service":  # the lines for this host's systemd, if marked
            content = content.replace(GROWTH_MARKER, values["restart_growth"] + "\n", 1)
            if WORKLOAD_MARKER in content:
                try:
                    lines = workload_lines(paths)
                except ValueError as exc:
                    raise AssetError(f"cannot write `[workload] writable_paths` into "
                                     f"{template_name}: {exc}; change it in the config") from None
                content = content.replace(WORKLOAD_MARKER, lines + "\n", 1)
        host_path, path, mode = where[template_name]
        out.append(Asset(host_path, path, mode, content.encode()))
    return tuple(out)


def _write(asset: Asset) -> None:
    files.atomic_write(asset.path, asset.content, asset.mode)  # DiskError names the path and fix


def hold(assets: tuple[Asset, ...]) -> list[Asset]:
    """Keep existing assets as they are; write only the missing ones. Returns those written."""
    written = []
    for asset in assets:
        if not asset.path.exists():
            _write(asset)
            written.append(asset)
    return written


def converge(assets: tuple[Asset, ...]) -> list[Asset]:
    """Rewrite the assets that differ from disk (content or mode). Returns those written."""
    written = []
    for asset in assets:
        try:
            same_mode = (asset.path.stat().st_mode & 0o7777) == asset.mode
        except FileNotFoundError:
            same_mode = False
        if not (same_mode and asset.matches_disk()):
            _write(asset)
            written.append(asset)
    return written


def write_all(assets: tuple[Asset, ...]) -> list[Asset]:
    """Write every asset, whatever is on disk."""
    for asset in assets:
        _write(asset)
    return list(assets)
