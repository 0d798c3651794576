"""The service assets: the agent unit, the recovery unit and the recovery script.

Each release carries templates of them (`assets/` in the release). Rendered for this host they
are compared with what is on disk and written in one of three ways:

- hold: keep every existing file byte for byte, write only missing ones (an upgrade is pending,
  so what is on disk is the last-good's and is the only way back; the missing ones come from the
  last-good's copy in `kept_assets`, never from the candidate);
- converge: rewrite the ones that differ;
- write all.

Every value goes through `quoted` first: a unit's by systemd's rules, the script's by the
shell's (`quoting`), so no host value can add a line, a setting or a command.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import NamedTuple

from ... import files
from ...errors import AssetError
from ..paths import Paths
from ..quoting import shell_word, unit_path, unit_token, unit_word

UNIT_MODE = 0o644
SCRIPT_MODE = 0o755
TEMPLATES = ("agent.service", "recovery.service", "recovery.sh")


class Asset(NamedTuple):
    host_path: Path  # as systemd and the units name it
    path: Path  # where it is written (below --root, if any)
    mode: int
    content: bytes

    def on_disk(self) -> bytes | None:
        return files.read_bytes(self.path)

    def matches_disk(self) -> bool:
        return self.on_disk() == self.content


def variables(paths: Paths, version: str) -> dict[str, str]:
    """The names a template may use: host values as they are (`quoted` writes them)."""
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
        # A candidate that keeps failing hits the start limit after max_attempts starts, and
        # systemd's OnFailure= starts recovery: no long restart loop.
        "max_attempts": str(judgment.max_attempts),
        # Seconds to the microsecond systemd counts in, written as given: 1 stays "1".
        "restart_sec": f"{judgment.restart_seconds:.6f}".rstrip("0").rstrip("."),
    }


# How each value is written into a unit (see `quoting`): names and numbers as plain tokens, the
# config file as one ExecStart= argument, every other value a path. The script quotes them all
# as shell words.
_UNIT_TOKENS = {"name", "version", "agent_unit", "recovery_unit", "timeout_start_sec",
                "max_attempts", "restart_sec"}
_UNIT_WORDS = {"config"}


def quoted(values: dict[str, str], template_name: str) -> dict[str, str]:
    """`values` as they are written into `template_name`: a unit's by systemd's rules, the
    script's by the shell's. AssetError (one line, naming the value) if one cannot be written."""
    out = {}
    for key, value in values.items():
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
    """Render a release's asset templates for this host, in the order of TEMPLATES."""
    where = targets(paths)
    values = variables(paths, version)
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
