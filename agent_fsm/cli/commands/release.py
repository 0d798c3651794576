"""`agent-fsm release pack|add|list|prune`: make, store, list and prune releases."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from .. import options, render
from ..exits import EXIT_CODES
from ..render import out

app = typer.Typer(
    help="Make, add, list and prune releases.\n\nExample: agent-fsm release list --json",
    no_args_is_help=True, epilog=EXIT_CODES)


@app.command("pack", epilog=EXIT_CODES)
def release_pack(
    version: Annotated[str, typer.Option("--version", help="The release's version.")],
    output: Annotated[Path, typer.Option("--output", help="The release directory to create.")],
    workload: Annotated[str | None, typer.Option(
        "--workload", help="A command (shell words) the daemon supervises once the gate opens.",
        show_default=False)] = None,
) -> None:
    """Make a release directory from this agent-fsm: release.toml, bin/agent-fsm, assets/.

    Example: agent-fsm release pack --version 2.0.0 --output ./agent-fsm-2.0.0
    """
    from ...actions.packing import pack

    try:
        argv = tuple(shlex.split(workload)) if workload else ()
    except ValueError as exc:  # an unclosed quote or a trailing backslash
        raise typer.BadParameter(f"{workload!r} is not a command in shell words: {exc}",
                                 param_hint="--workload") from None
    path = pack(version, output, argv)
    out.print(f"packed release {version} in {path}", markup=False)


@app.command("add", epilog=EXIT_CODES)
def release_add(
    ctx: typer.Context,
    directory: Annotated[Path, typer.Argument(help="A release directory (from `release pack`).")],
) -> None:
    """Validate a release directory and store a normalized copy of it on this host.

    The copy holds regular files and directories only (a symlink, device, FIFO or socket in
    DIRECTORY is refused, exit 1), owned by root, modes 0755 (directories, executables) or 0644,
    and its digest is recorded. Adding a version already stored with other content is refused
    (exit 3), naming both digests; with the same content it says "already stored" (exit 0).

    Example: agent-fsm release add ./agent-fsm-2.0.0
    """
    from ...actions.packing import add

    added = add(directory, options.of(ctx).node())
    verb = "already stored at" if added.already and not added.replaced else "stored at"
    note = f"; it replaced the stored copy: {added.replaced}" if added.replaced else ""
    out.print(f"release {added.version} {verb} {added.path} ({added.digest}{note})",
              markup=False)


@app.command("list", epilog=EXIT_CODES)
def release_list(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="A JSON list.")] = False,
) -> None:
    """List the stored releases with their digests, marking the selected and the last-good.

    Each release is checked against the digest recorded when it was added; one that no longer
    matches is marked DAMAGED with what differs (it is refused when selected or rendered).
    --json: a list of {version, selected, last_good, digest, digest_recorded, intact, problem}.

    Example: agent-fsm release list --json
    """
    releases = options.of(ctx).node().host.releases
    selected, last_good = releases.selected(), releases.last_good()
    rows = []
    for v in releases.versions():
        check = releases.integrity(v)
        rows.append({"version": v, "selected": v == selected, "last_good": v == last_good,
                     "digest": check.digest, "digest_recorded": check.recorded,
                     "intact": check.problem is None, "problem": check.problem})
    if as_json:
        render.print_json(rows)
        return
    for r in rows:
        marks = [m for m, on in (("selected", r["selected"]), ("last-good", r["last_good"])) if on]
        line = f"{r['version']}  {r['digest'] or 'no digest'}"
        line += f"  ({', '.join(marks)})" if marks else ""
        if not r["digest_recorded"] and r["intact"]:
            line += "  (stored before digests were kept; recorded when next selected)"
        line += f"  DAMAGED: {r['problem']}" if r["problem"] else ""
        out.print(line, markup=False)


@app.command("prune", epilog=EXIT_CODES)
def release_prune(
    ctx: typer.Context,
    versions: Annotated[list[str] | None, typer.Argument(
        metavar="VERSION", help="Remove exactly these releases (refused, exit 3, if any is protected).",
        show_default=False)] = None,
    keep: Annotated[int | None, typer.Option(
        "--keep", min=0, metavar="N", help="Keep the N newest unprotected releases, remove the rest.",
        show_default=False)] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Say what would be removed and kept; remove nothing.")] = False,
    as_json: Annotated[bool, typer.Option(
        "--json", help="One JSON object: removed, kept (version, why), dry_run.")] = False,
) -> None:
    """Remove stored releases that neither the way back nor an owed transition needs.

    Never removed, whatever is asked: the selected, the last-good, both ends of a pending
    upgrade, and every version a transition interrupted by a crash still names (`status` shows
    it as owed). With no arguments, releases newer than the selected are kept too (staged for a
    coming upgrade) and the older ones removed. With --keep N, the N newest of the others are
    kept and the rest removed, staged ones included. With VERSION..., exactly those are
    removed; if any is protected, the prune is refused (exit 3) and nothing is removed. A
    damaged state file refuses the prune (exit 1). One line per release: `removed V` or
    `kept V (why)`.

    Example: agent-fsm release prune --dry-run, then agent-fsm release prune --keep 2
    """
    from ...actions.packing import prune
    from ...node.releases import natural_key

    if versions and keep is not None:
        raise typer.BadParameter("name releases to remove, or give --keep N, not both",
                                 param_hint="--keep")
    result = prune(options.of(ctx).node(), tuple(versions or ()), keep=keep, dry_run=dry_run)
    if as_json:
        render.print_json(result.to_json())
        return
    kept = dict(result.kept)
    verb = "would remove" if dry_run else "removed"
    for version in sorted({*result.removed, *kept}, key=natural_key):
        line = f"{verb} {version}" if version in result.removed else (
            f"kept {version} ({', '.join(kept[version])})")
        out.print(line, markup=False)
    if not result.removed:
        out.print("nothing to prune" if kept else "no releases stored", markup=False)
