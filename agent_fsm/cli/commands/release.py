"""`agent-fsm release pack|sign|digest|add|list|prune`: make, sign, store, list and prune releases."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ...node.state.reasons import MAX_REASON
from ...node.store_config import size_text
from ...untrusted import MAX_LINE, shown
from .. import options, render
from ..exits import EXIT_CODES
from ..render import out

if TYPE_CHECKING:
    from ...actions.releases.packing import Added
    from ...node.releases.tree import Hashed
    from ...wiring import Node

app = typer.Typer(
    help="Make, sign, add, list and prune releases.\n\nExample: agent-fsm release pack "
         "--version 1.0.0 --output ./myagent-1.0.0 --payload ./build --workload "
         "'{payload_dir}/myagent --port 8080', then agent-fsm release add ./myagent-1.0.0",
    no_args_is_help=True, epilog=EXIT_CODES)


@app.command("pack", epilog=EXIT_CODES)
def release_pack(
    ctx: typer.Context,
    version: Annotated[str, typer.Option("--version", help="The release's version.")],
    output: Annotated[Path | None, typer.Option(
        "--output", help="The release directory to create.", show_default=False)] = None,
    workload: Annotated[str | None, typer.Option(
        "--workload", help="Your agent: a command (shell words, split here) the daemon "
        "supervises, a candidate's from the start of its judgment; {release_dir}, {payload_dir} "
        "and {version} are expanded when it starts, {{ and }} are literal braces.",
        show_default=False)] = None,
    payload: Annotated[Path | None, typer.Option(
        "--payload", metavar="SRC", show_default=False,
        help="A directory whose tree goes into the release as payload/ (your agent: its binary "
             "or script and data files): regular files and directories only, modes 0755 "
             "(directories, executables) or 0644; in the digest and the signature.")] = None,
    sign_key: Annotated[Path | None, typer.Option(
        "--sign-key", metavar="KEY", help="Sign the release (release.sig) with this SSH key: a "
        "private key file, or a public one whose private half is in ssh-agent.",
        show_default=False)] = None,
    image: Annotated[str | None, typer.Option(
        "--image", metavar="REF", show_default=False,
        help="Build a release image with podman: NAME or containers-storage:NAME (tagged in "
             "podman's store), or oci-archive:FILE / docker-archive:FILE (written there).")] = None,
    target: Annotated[list[str] | None, typer.Option(
        "--target", metavar="cpXY-MACHINE", show_default=False,
        help="A node interpreter the release must run on (repeatable), e.g. cp313-aarch64; "
             "default: CPython 3.11 to 3.14 on x86_64 and aarch64 (docs/operations.md).")] = None,
    quiet: Annotated[bool, typer.Option(
        "--quiet", help="No progress on stderr (shown for a long copy: a bar on a terminal, a "
        "line every 5 s when piped).")] = False,
) -> None:
    """Make a release directory from this agent-fsm, and print its digest.

    It holds release.toml, python.toml (what it needs of the node's python), bin/agent-fsm, lib/,
    assets/, with --payload SRC a copy of SRC in payload/, and with --sign-key a release.sig over
    all the rest. With --image, also a release image holding it at /agent-fsm/release
    (docs/containers.md). SRC is checked as `release add` checks a release: a symlink, device, FIFO,
    socket, setuid or setgid file, or a tree over the store's limits is refused (exit 1), naming the
    path.

    Example: agent-fsm release pack --version 2.0.0 --output ./myagent-2.0.0 --payload ./build
    --sign-key ~/.ssh/id_ed25519
    """
    from ...actions.releases.packing import packed

    try:
        argv = tuple(shlex.split(workload)) if workload else ()
    except ValueError as exc:  # an unclosed quote or a trailing backslash
        raise typer.BadParameter(f"{workload!r} is not a command in shell words: {exc}",
                                 param_hint="--workload") from None
    from ..copy_progress import shown_on_stderr

    if image is not None:
        from .release_images import pack_image

        with shown_on_stderr(quiet) as report:
            pack_image(ctx, version, output, argv, image, sign_key, payload, report)
        return
    if output is None:
        raise typer.BadParameter("give --output DIR, --image REF, or both", param_hint="--output")
    from ...actions.releases import abi

    with shown_on_stderr(quiet) as report:
        made = packed(version, output, argv, sign_key, tuple(target) if target else abi.FLEET,
                      payload=payload, report=report)
    path = made.path
    signed = f", signed with {sign_key}" if sign_key is not None else ""
    need = abi.read(path) or abi.Needs()
    out.print(f"packed release {version} in {path} (release digest {made.digest}{signed}); "
              "it covers "
              f"{abi.covers(need.targets, need.requires_python)}", markup=False, soft_wrap=True)


@app.command("sign", epilog=EXIT_CODES)
def release_sign(
    directory: Annotated[Path, typer.Argument(
        metavar="DIRECTORY", help="A packed release directory (from `release pack`), not a "
        "stored one.")],
    sign_key: Annotated[Path, typer.Option(
        "--sign-key", metavar="KEY", help="The SSH key to sign with: a private key file, or a "
        "public one whose private half is in ssh-agent.")],
) -> None:
    """Sign a packed release directory: write or replace its release.sig, nothing else.

    The signature is OpenSSH's (`ssh-keygen -Y sign`, namespace agent-fsm-release) over the text
    `release digest DIRECTORY` prints. A stored release is refused: sign the directory it was added
    from. A tree the store would refuse (a symlink, a device) is refused, naming the path (exit 1).

    Example: agent-fsm release sign ./myagent-2.0.0 --sign-key ~/.ssh/release_ed25519
    """
    from ...actions.releases import trust

    version = trust.packed(directory, signing_it=True)
    signed = trust.sign(directory, sign_key)
    out.print(f"signed release {version} in {directory} with {sign_key}: "
              f"{directory / 'release.sig'} signs {signed}", markup=False, soft_wrap=True)


@app.command("digest", epilog=EXIT_CODES)
def release_digest(
    directory: Annotated[Path, typer.Argument(
        metavar="DIRECTORY", help="A release directory: packed, or stored.")],
) -> None:
    """Print the digest a release's signature covers, `sha256:<hex>`, from DIRECTORY alone.

    It is the SHA-256 of the manifest: a line per file and directory (type, mode, size, SHA-256,
    path), release.sig left out. So for a signed release it differs from the digest `release add`
    prints. docs/operations.md (Signed releases) computes it with coreutils.

    Example: agent-fsm release digest ./myagent-2.0.0; to check its signature by hand: printf %s
    "$(agent-fsm release digest ./myagent-2.0.0)" | ssh-keygen -Y verify -f allowed_signers -I
    release@example.com -n agent-fsm-release -s ./myagent-2.0.0/release.sig
    """
    from ...actions.releases import trust

    trust.packed(directory)
    out.print(trust.digest(directory), markup=False)


@app.command("add", epilog=EXIT_CODES)
def release_add(
    ctx: typer.Context,
    source: Annotated[str, typer.Argument(
        metavar="DIRECTORY|ARCHIVE|IMAGE", help="A release directory (from `release pack`), a "
        "tar archive of one (.tar, .tar.gz, .tgz), or an image: oci-archive:FILE, "
        "docker-archive:FILE, containers-storage:REF or docker://REF.")],
    quiet: Annotated[bool, typer.Option(
        "--quiet", help="No progress on stderr (shown for a long copy: a bar on a terminal, a "
        "line every 5 s when piped).")] = False,
) -> None:
    """Validate a release directory, archive or image and store a normalized copy on this host.

    The copy holds only regular files and directories, owned by root, modes 0755 or 0644. A symlink,
    device, FIFO or socket is refused (exit 1). The digest printed covers everything stored; for a
    signed release, the digest its release.sig signs follows. An archive holds the release at its
    top or in one top directory. A member that is absolute, has a `..`, or is a link, device or FIFO
    is refused (exit 1). An image holds the release at /agent-fsm/release. podman pulls it if
    needed, and its id is recorded (docs/containers.md).

    Refused (exit 3): a version stored with other content (same content: "already stored", exit 0);
    with `allowed_signers` set, a release no listed key signed; compiled extensions the config's
    `python` cannot load.

    Example: agent-fsm release add ./agent-fsm-2.0.0, ./agent-fsm-2.0.0.tar.gz, or
    oci-archive:./agent-fsm-2.0.0.tar
    """
    add_from(options.of(ctx).node(), source, quiet=quiet)


def add_from(node: Node, source: str, *, quiet: bool = False) -> Added:
    """Store the release `source` names, say so in one line, and show the copy's progress on stderr
    unless `quiet`: what `release add` and `install --from` run."""
    from ...actions.releases.sources import add_source
    from ..copy_progress import shown_on_stderr
    from .release_images import show_image

    with shown_on_stderr(quiet) as report:
        added = add_source(source, node, report)
    if added.image is not None:
        show_image(added.image)
    verb = "already stored at" if added.already and not added.replaced else "stored at"
    note = f"; it replaced the stored copy: {shown(added.replaced, MAX_LINE)}" \
        if added.replaced else ""
    if (added.path / "release.sig").is_file():  # the stored digest covers it, the signed not
        from ...node.releases import signing

        signed = signing.message(added.path, stored=True).decode("ascii")
        note = f"; its release.sig signs {signed}{note}"
    out.print(f"release {added.version} {verb} {shown(added.path)} ({shown(added.digest)}{note})")
    return added


@app.command("list", epilog=EXIT_CODES)
def release_list(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="A JSON list.")] = False,
) -> None:
    """List the stored releases with their digests, marking the selected and the last-good.

    DAMAGED: no longer matching the digest recorded when added (what differs is shown); refused when
    selected or rendered. KNOWN BAD: rolled back here (`upgrade` refuses it unless --force). A
    signed release also shows the digest its release.sig signs.

    --json: a list of {version, selected, last_good, digest, digest_recorded, signed_digest, intact,
    problem, images, known_bad, covers}. signed_digest: null when unsigned; images: each {reference,
    id, digest, added}; known_bad: null or {version, time, reason, reason_class}; covers: the
    targets of its python.toml (["any"]: every CPython 3.11+), null without one.

    Example: agent-fsm release list --json
    """
    from ...actions.releases import abi
    from ...actions.releases.origins import read
    from ...errors import ReleaseError
    from ...node.records import known_bad

    def needs(version: str) -> abi.Needs | None:
        try:
            return abi.read(releases.path(version))
        except ReleaseError:  # shown by `doctor`; a listing goes on
            return None

    node = options.of(ctx).node()
    releases = node.effectors.releases
    selected, last_good = releases.selected(), releases.last_good()
    bad = {k["version"]: k for k in known_bad.view(node.paths)[0]}
    rows = []
    covered: dict[str, str] = {}
    seen: Hashed = {}  # a file several releases share is read once
    for v in releases.versions():
        check = releases.integrity(v, seen)
        rows.append({"version": v, "selected": v == selected, "last_good": v == last_good,
                     "digest": check.digest, "digest_recorded": check.recorded,
                     "signed_digest": check.signed,
                     "intact": check.problem is None, "problem": check.problem,
                     "images": [i.to_json() for i in read(node, v)], "known_bad": bad.get(v),
                     "covers": None if (need := needs(v)) is None else list(need.targets)})
        if need is not None:
            covered[v] = abi.covers(need.targets, need.requires_python)
    if as_json:
        render.print_json(rows)
        return
    if not rows:
        out.print(f"no releases stored in {node.paths.releases_dir}; add one with "
                  "`agent-fsm release add DIR`", markup=False)
    for r in rows:
        marks = [m for m, on in (("selected", r["selected"]), ("last-good", r["last_good"])) if on]
        line = f"{shown(r['version'])}  {shown(r['digest'] or 'no digest')}"
        line += f"  ({', '.join(marks)})" if marks else ""
        line += f"  release.sig signs {shown(r['signed_digest'])}" if r["signed_digest"] else ""
        line += f"  DAMAGED: {shown(r['problem'], MAX_LINE)}" if r["problem"] else ""
        k = bad.get(str(r["version"]))
        if k:  # `upgrade --to` refuses it unless --force
            line += f"  KNOWN BAD: rolled back {render.when(k['time'])} " \
                    f"({render.words(shown(k['reason_class']))}: " \
                    f"{shown(k['reason'], MAX_REASON)}; upgrade refuses it unless --force)"
        out.print(line, markup=False)
        if str(r["version"]) in covered:
            out.print(f"  covers {shown(covered[str(r['version'])], MAX_LINE)}")
        for i in read(node, str(r["version"])):
            out.print(f"  image {shown(i.id)} ({shown(i.reference)}, manifest "
                      f"{shown(i.digest or 'unknown')})", soft_wrap=True)


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
        "--json", help="One JSON object: removed, kept (version, why), dry_run, freed_bytes, "
        "images, freed.")] = False,
) -> None:
    """Remove stored releases that neither the way back nor an owed transition needs.

    Never removed: the selected, the last-good, both ends of a pending upgrade, and every version an
    owed transition names. With no arguments, the releases older than the selected go and newer ones
    (staged) stay, unless known bad. --keep N keeps the N newest of the others, staged or not.
    VERSION... removes exactly those; if any is protected, nothing is removed (exit 3).

    One line per release: `removed V` or `kept V (why)`. Images go with their release, but those
    agent-fsm did not put in podman's store (docs/containers.md); one podman will not remove is
    named and makes the exit 1. The last line says what was freed on disk, `freed 1.1 GiB` (`would
    free` with --dry-run); files a kept release shares free nothing.

    Example: agent-fsm release prune --dry-run, then agent-fsm release prune --keep 2
    """
    from ...actions.releases.pruning import prune
    from ...node.releases.pointers import natural_key
    from . import release_images

    if versions and keep is not None:
        raise typer.BadParameter("name releases to remove, or give --keep N, not both",
                                 param_hint="--keep")
    result = prune(options.of(ctx).node(), tuple(versions or ()), keep=keep, dry_run=dry_run)
    if as_json:
        render.print_json(result.to_json())
        release_images.images_failed(result.images)
        return
    kept = dict(result.kept)
    verb = "would remove" if dry_run else "removed"
    for version in sorted({*result.removed, *kept}, key=natural_key):
        line = f"{verb} {version}" if version in result.removed else (
            f"kept {version} ({', '.join(kept[version])})")
        out.print(line, markup=False)
    release_images.show_images(result.images, dry_run)
    if not result.removed and not result.images.removed and not result.freed_bytes:
        out.print("nothing to prune" if kept else "no releases stored", markup=False)
    elif dry_run:
        out.print(f"would free {size_text(result.freed_bytes)}", markup=False)
    else:
        files = f" ({result.freed.files:,} files no stored release uses)" \
            if result.freed.files else ""
        out.print(f"freed {size_text(result.freed_bytes)}{files}", markup=False)
    release_images.images_failed(result.images)
