"""The service assets on disk as `status` shows them: compared with what the selected release would
write, held or not. A unified diff on request."""

from __future__ import annotations

from typing import Any, NamedTuple

from ...errors import AgentFsmError
from ...node.assets import render as assets
from ...node.paths import Paths
from ...node.releases.pointers import Releases

ROLES = ("agent unit", "recovery unit", "recovery script")


class AssetView(NamedTuple):
    """One service asset on disk, compared with what the selected release would write."""

    role: str
    path: str  # where it is (below --root, if any)
    host_path: str  # as systemd and the units name it
    on_disk: bool
    held: bool  # an upgrade is pending, so this file is the last-good's and is kept as it is
    compared: str  # "same", "differs", "mode_differs", "missing" or "unknown"
    diff: str | None  # a unified diff, on request, when the content differs

    def to_json(self) -> dict[str, Any]:
        return {"role": self.role, "path": self.path, "host_path": self.host_path,
                "on_disk": self.on_disk, "held": self.held, "compared": self.compared,
                "diff": self.diff}


def _diff(on_disk: bytes, want: bytes, path: str, selected: str | None) -> str:
    import difflib  # only with --diff

    return "".join(difflib.unified_diff(
        on_disk.decode(errors="replace").splitlines(keepends=True),
        want.decode(errors="replace").splitlines(keepends=True),
        fromfile=f"{path} (on disk)", tofile=f"{path} ({selected} would write)"))


def compare(paths: Paths, releases: Releases, held: bool, selected: str | None,
            diff: bool) -> tuple[tuple[AssetView, ...], str | None]:
    """Each asset on disk against the selected release's rendering of it, and why that rendering
    failed (None when it did not or nothing is selected)."""
    host_paths = (paths.host_agent_unit, paths.host_recovery_unit, paths.host_recovery_script)
    rendered: dict[str, tuple[bytes, int]] = {}
    error = None
    if selected is not None:
        try:
            rendered = {str(a.path): (a.content, a.mode)  # compared only: doctor checks digests
                        for a in assets.render(releases.path(selected), paths, selected)}
        except AgentFsmError as exc:  # a broken candidate must not break status
            error = str(exc)
    views = []
    for role, path, host_path in zip(ROLES, (paths.agent_unit, paths.recovery_unit,
                                             paths.recovery_script), host_paths, strict=True):
        try:
            on_disk: bytes | None = path.read_bytes()
            mode: int | None = path.stat().st_mode & 0o7777
        except FileNotFoundError:
            on_disk, mode = None, None
        want = rendered.get(str(path))
        text_diff = None
        if on_disk is None:
            compared = "missing"
        elif want is None:
            compared = "unknown"
        elif on_disk != want[0]:
            compared = "differs"
            if diff:
                text_diff = _diff(on_disk, want[0], str(path), selected)
        elif mode != want[1]:
            compared = "mode_differs"
            if diff:
                text_diff = f"mode {mode:04o} on disk, {selected} would write {want[1]:04o}\n"
        else:
            compared = "same"
        views.append(AssetView(role, str(path), str(host_path), on_disk is not None,
                               held and on_disk is not None, compared, text_diff))
    return tuple(views), error
