"""The last-good's service assets and settings, kept so the way back needs no release or config.

On promotion, what the release renders for this host goes into one atomic file,
`last-good-assets.json`, with the host values used and the host's settings; the kept assets are
always one release's. `refresh` updates the settings whenever the config reads valid. `python`
is also in `last-good-python`, one line, for the launcher. The way back uses these settings when
the live config is wrong, and holding restores missing assets from here. A damaged file is
refused and left untouched.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import files
from ...errors import AssetError, DocumentError, ReleaseError
from .. import config as config_mod
from ..paths import Paths
from ..releases.pointers import Releases
from ..state import validate
from ..state.document_file import Kind
from .render import TEMPLATES, Asset, render, systemd_version, targets, variables

SCHEMA = 1
FILE_MODE = 0o600  # in the agent's private state dir; nobody else needs to read it
ALLOWED_MODE_BITS = 0o755  # what an asset may have: no setuid, nothing group/world-writable
MAX_BYTES = 16 << 20


@dataclass(frozen=True)
class KeptAssets:
    """The assets one release rendered for this host when it was promoted to last-good."""

    version: str
    rendered_for: dict[str, str]  # the template variables they were rendered with
    contents: dict[str, tuple[int, bytes]]  # template name -> (mode, bytes)
    settings: dict[str, Any] | None = None  # the config then (`config.to_table`); None: older

    def fits(self, paths: Paths) -> bool:
        """Whether rendering the release now would give these bytes: same host values."""
        return self.rendered_for == variables(paths, self.version, systemd_version(paths))

    def assets(self, paths: Paths) -> tuple[Asset, ...]:
        """The kept assets at this host's paths, in the order of TEMPLATES."""
        where = targets(paths)
        out = []
        for name in TEMPLATES:
            host_path, path, _ = where[name]
            mode, content = self.contents[name]
            out.append(Asset(host_path, path, mode, content))
        return tuple(out)


@dataclass(frozen=True)
class Found:
    """The last-good's assets to restore, and where they came from (for the log)."""

    assets: tuple[Asset, ...]
    source: str
    fallback: bool  # not the exact kept copy: worth a warning


def _render(paths: Paths, releases: Releases, version: str) -> tuple[Asset, ...]:
    releases.manifest(version)
    return render(releases.path(version), paths, version)


def last_good(paths: Paths, releases: Releases) -> Found:
    """The last-good's assets for this host, never the candidate's.

    The copy kept at promotion, else rendered from the last-good's release.
    """
    version = releases.last_good()
    if version is None:
        raise AssetError(f"there is no last-good release ({paths.last_good} is missing) whose "
                         "assets could be restored; restore the missing asset(s) by hand")
    where = paths.last_good_assets
    try:
        kept = read(where)
    except AssetError as exc:
        kept, why = None, str(exc)
    else:
        if kept is None:
            why = f"no copy of its assets is kept in {where} (promoted by an older agent-fsm)"
        elif kept.version != version:
            why = f"the copy kept in {where} is release {kept.version}'s"
        elif not kept.fits(paths):
            why = f"the copy kept in {where} was rendered for other host settings"
        else:
            return Found(kept.assets(paths),
                         f"from the copy of last-good {version}'s assets kept in {where}", False)
    try:
        rendered = _render(paths, releases, version)
    except (AssetError, ReleaseError) as exc:
        if kept is not None and kept.version == version:
            return Found(kept.assets(paths), f"from the copy kept in {where} all the same: {why}, "
                         f"and last-good {version}'s release cannot render them ({exc})", True)
        raise AssetError(
            f"cannot restore last-good {version}'s missing asset(s): {why}; and its release "
            f"cannot render them ({exc}); re-add release {version} with `agent-fsm release add "
            "DIR`, or restore the missing asset(s) by hand, then restart the agent unit"
        ) from None
    return Found(rendered, f"rendered from last-good {version}'s release "
                 f"{releases.path(version)}, because {why}", True)


def keep_release(paths: Paths, releases: Releases, version: str) -> AssetError | None:
    """Keep what `version` renders for this host, before it is promoted to last-good.

    If it does not render, no copy is kept and the reason is returned, not raised: `complete`
    tolerates such a candidate.
    """
    try:
        rendered = _render(paths, releases, version)
    except AssetError as exc:
        discard(paths.last_good_assets)
        return exc
    keep(paths, version, rendered)
    return None


def keep(paths: Paths, version: str, rendered: tuple[Asset, ...]) -> None:
    """Keep what `version` renders for this host (`rendered`) as the last-good's assets."""
    names = {path: name for name, (_, path, _) in targets(paths).items()}
    contents = {names[a.path]: a for a in rendered}
    if set(contents) != set(TEMPLATES):
        raise AssetError(f"cannot keep release {version}'s assets: rendered "
                         f"{', '.join(sorted(contents))}, expected {', '.join(TEMPLATES)}")
    body: dict[str, Any] = {
        "version": version,
        "rendered_for": variables(paths, version, systemd_version(paths)),
        "settings": config_mod.to_table(paths.config),
        "assets": {name: {"mode": a.mode, "content": base64.b64encode(a.content).decode()}
                   for name, a in sorted(contents.items())},
    }
    KIND.write(paths.last_good_assets, body)
    _keep_python(paths)


def _keep_python(paths: Paths) -> bool:
    """Keep the settings' `python` for the launcher, one absolute path on one line; whether it changed."""
    python = f"{paths.config.python}\n".encode()
    if files.read_bytes(paths.last_good_python) == python:
        return False
    files.atomic_write(paths.last_good_python, python, FILE_MODE)
    return True


def refresh(paths: Paths, kept: KeptAssets) -> bool:
    """Keep the settings of `paths.config`, read valid, with the copy `kept`; whether it wrote.

    The way back then runs with the settings last read valid, never older ones.
    """
    settings = config_mod.to_table(paths.config)
    wrote = kept.settings != settings
    if wrote:
        body: dict[str, Any] = {
            "version": kept.version, "rendered_for": kept.rendered_for, "settings": settings,
            "assets": {name: {"mode": mode, "content": base64.b64encode(content).decode()}
                       for name, (mode, content) in sorted(kept.contents.items())},
        }
        KIND.write(paths.last_good_assets, body)
    return _keep_python(paths) or wrote


def discard(path: Path) -> bool:
    """Remove the kept copy (a stale one is worse than none); return whether it existed."""
    return files.remove(path)


def read(path: Path) -> KeptAssets | None:
    """The kept copy, or None when there is none.

    A damaged, unknown or nonsensical file raises AssetError and is left untouched.
    """
    try:
        data = KIND.read(path)
    except DocumentError as exc:
        raise AssetError(
            f"the kept copy of the last-good's assets {path} is unusable ({exc.why}); it was "
            "left untouched and is not used; it is written again when a release is next "
            "promoted (`agent-fsm install`, `agent-fsm activate` or a completed upgrade)"
        ) from None
    if data is None:
        return None
    contents = {name: (a["mode"], base64.b64decode(a["content"], validate=True))
                for name, a in data["assets"].items()}
    return KeptAssets(data["version"], dict(data["rendered_for"]), contents,
                      data.get("settings"))


def _check(data: dict[str, Any], schema: int) -> None:
    validate.version(data.get("version", validate.MISSING), "version")
    rendered_for = validate.obj(data.get("rendered_for", validate.MISSING), "rendered_for")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in rendered_for.items()):
        raise validate.invalid("rendered_for", rendered_for, "a table of strings")
    kept = validate.obj(data.get("assets", validate.MISSING), "assets")
    if set(kept) != set(TEMPLATES):
        raise validate.invalid("assets", sorted(kept), f"exactly {', '.join(TEMPLATES)}")
    for name in TEMPLATES:
        entry = validate.obj(kept[name], f"assets.{name}")
        if set(entry) != {"mode", "content"}:
            raise validate.invalid(f"assets.{name}", sorted(entry), "exactly mode and content")
        mode, content = entry["mode"], entry["content"]
        if isinstance(mode, bool) or not isinstance(mode, int) \
                or mode < 0 or mode & ~ALLOWED_MODE_BITS:
            raise validate.invalid(f"assets.{name}.mode", mode,
                                   f"a mode within {ALLOWED_MODE_BITS:04o}")
        try:
            base64.b64decode(content, validate=True)
        except (TypeError, ValueError):  # binascii.Error is a ValueError
            raise validate.invalid(f"assets.{name}.content", content, "base64") from None
    if "settings" in data:  # absent in a copy kept before settings were. Its keys are checked
        validate.obj(data["settings"], "settings")  # where used: the assets stay usable anyway


KIND = Kind("kept-assets", "kept assets file", "the kept copy", SCHEMA, _check, MAX_BYTES,
            FILE_MODE, utf8=True)
