"""`agent-fsm channel init|publish|rollout|halt|revoke|refresh|rotate|show`: a signed channel, a
directory to upload to any static HTTPS server (docs/fleet.md)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from ...errors import EXIT_USAGE
from ...untrusted import MAX_LINE, shown
from .. import render
from ..exits import EXIT_CODES
from ..render import out

if TYPE_CHECKING:
    from ...actions.channel.publishing import Channel

app = typer.Typer(
    help="Publish releases to a signed channel that nodes follow (docs/fleet.md).\n\n"
         "Example: agent-fsm channel init ./stable --channel stable --root-key "
         "root=./root_ed25519 --index-key ci=./ci_ed25519, then agent-fsm channel publish "
         "./stable --version 1.1.0 --archive myagent-1.1.0.tar.gz --rollout 10 --key "
         "ci=./ci_ed25519, and upload ./stable to the server.",
    no_args_is_help=True, epilog=EXIT_CODES)

Dir = Annotated[Path, typer.Argument(metavar="DIR", help="The channel's directory.")]
Keys = Annotated[list[str], typer.Option(
    "--key", metavar="NAME=FILE", help="A key the root names for the index, and its file (a "
    "private key, or a public one whose private half is in ssh-agent); repeat for more.")]
Days = Annotated[int, typer.Option("--expires-days", min=1, max=3650, help="Days until the "
                                   "index expires: nodes refuse it after (a frozen channel).")]
Json = Annotated[bool, typer.Option("--json", help="One JSON object, for programs.")]


def _keys(pairs: list[str], option: str) -> dict[str, Path]:
    keys: dict[str, Path] = {}
    for pair in pairs:
        name, eq, path = pair.partition("=")
        if not eq or not name or not path:
            _usage(f"{option} takes NAME=FILE, not {pair!r}")
        keys[name] = Path(path)
    if not keys:
        _usage(f"give at least one {option} NAME=FILE")
    return keys


def _usage(message: str) -> NoReturn:
    sys.stderr.write(f"agent-fsm: channel: {shown(message, MAX_LINE)}; nothing was changed\n")
    raise typer.Exit(EXIT_USAGE)


def _time(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        _usage(f"--not-before takes an ISO 8601 time such as 2027-01-31T06:00:00Z, not {text!r}")
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _show(ch: Channel, as_json: bool) -> None:
    from ...node.channel.documents import stamp

    if as_json:
        data: dict[str, Any] = {"directory": str(ch.directory), "changed": ch.changed,
                                "root": ch.root.to_json(), "index": ch.index.to_json()}
        render.print_json(data)
        return
    if ch.changed:
        out.print(shown(ch.changed, MAX_LINE), markup=False)
        return
    i = ch.index
    out.print(f"channel {shown(i.channel)}: index version {i.version}, expires "
              f"{stamp(i.expires)}; root version {ch.root.version}, expires "
              f"{stamp(ch.root.expires)}", markup=False)
    for e in reversed(i.releases):
        where = e.archive or e.image or ""
        marks = [f"rollout {e.rollout} %"]
        if e.not_before is not None:
            marks.append(f"not before {stamp(e.not_before)}")
        if e.revoked is not None:
            marks.append(f"revoked: {e.revoked}")
        out.print(f"  {shown(e.version)}  {'; '.join(shown(m) for m in marks)}  "
                  f"{shown(where)}  {e.digest}", markup=False)


@app.command("init", epilog=EXIT_CODES)
def channel_init(
    directory: Dir,
    channel: Annotated[str, typer.Option("--channel", metavar="NAME",
                                         help="The channel's name, which nodes name too.")],
    root_keys: Annotated[list[str], typer.Option(
        "--root-key", metavar="NAME=FILE", help="A key that signs roots (kept offline; a "
        "primary and a backup, say); repeat for more. Each signs root version 1.")],
    index_keys: Annotated[list[str], typer.Option(
        "--index-key", metavar="NAME=FILE", help="A key that signs the index (CI's); repeat "
        "for more. Each signs the first, empty index.")],
    threshold: Annotated[int, typer.Option("--threshold", min=1, help="How many root keys "
                                           "must sign a new root.")] = 1,
    days: Days = 30,
    as_json: Json = False,
) -> None:
    """Make a new channel in DIR: root version 1 and an empty index, signed.

    Give each node a copy of DIR/root.json (its `[channel] root`): its root of trust.

    Example: agent-fsm channel init ./stable --channel stable --root-key primary=./primary
    --root-key backup=./backup --index-key ci=./ci
    """
    from ...actions.channel.publishing import init

    _show(init(directory, channel, root_keys=_keys(root_keys, "--root-key"),
               index_keys=_keys(index_keys, "--index-key"), threshold=threshold, now=_now(),
               index_days=days), as_json)


@app.command("publish", epilog=EXIT_CODES)
def channel_publish(
    directory: Dir,
    version: Annotated[str, typer.Option("--version", help="The release's version.")],
    keys: Keys,
    rollout: Annotated[int, typer.Option("--rollout", min=0, max=100, metavar="PERCENT",
                                         help="The share of nodes that take it.")] = 0,
    archive: Annotated[Path | None, typer.Option(
        "--archive", metavar="FILE", help="The release as a .tar/.tar.gz (of a `release "
        "pack` directory): copied under DIR/releases/.", show_default=False)] = None,
    image: Annotated[str | None, typer.Option(
        "--image", metavar="REF", help="The release as an image nodes pull (docker://…).",
        show_default=False)] = None,
    digest: Annotated[str | None, typer.Option(
        "--digest", metavar="sha256:HEX", help="The release digest `release pack` printed: "
        "needed for an image; checked for an archive.", show_default=False)] = None,
    not_before: Annotated[str | None, typer.Option(
        "--not-before", metavar="TIME", help="No node takes it before this ISO 8601 time.",
        show_default=False)] = None,
    days: Days = 30,
    as_json: Json = False,
) -> None:
    """Add a release to the channel at a rollout percentage (default 0: taken by no node yet).

    A node takes it when its bucket for this version (0-99, from its machine id) is below it.

    Example: agent-fsm channel publish ./stable --version 1.1.0 --archive ./myagent-1.1.0.tar.gz
    --rollout 10 --key ci=./ci_ed25519
    """
    from ...actions.channel.publishing import publish

    _show(publish(directory, version, rollout=rollout, keys=_keys(keys, "--key"), now=_now(),
                  archive=archive, image=image, digest=digest, not_before=_time(not_before),
                  days=days), as_json)


@app.command("rollout", epilog=EXIT_CODES)
def channel_rollout(
    directory: Dir,
    version: Annotated[str, typer.Argument(metavar="VERSION")],
    percent: Annotated[int, typer.Argument(metavar="PERCENT", min=0, max=100)],
    keys: Keys,
    days: Days = 30,
    as_json: Json = False,
) -> None:
    """Set a release's rollout: raising it never takes a node out; nodes that took it keep it.

    Example: agent-fsm channel rollout ./stable 1.1.0 50 --key ci=./ci_ed25519
    """
    from ...actions.channel.publishing import set_rollout

    _show(set_rollout(directory, version, percent, keys=_keys(keys, "--key"), now=_now(),
                      days=days), as_json)


@app.command("halt", epilog=EXIT_CODES)
def channel_halt(
    directory: Dir,
    version: Annotated[str, typer.Argument(metavar="VERSION")],
    keys: Keys,
    days: Days = 30,
    as_json: Json = False,
) -> None:
    """Halt a release's rollout (0 %): no more nodes take it; those that did keep it (revoke it to
    move them off).

    Example: agent-fsm channel halt ./stable 1.1.0 --key ci=./ci_ed25519
    """
    from ...actions.channel.publishing import set_rollout

    _show(set_rollout(directory, version, 0, keys=_keys(keys, "--key"), now=_now(), days=days),
          as_json)


@app.command("revoke", epilog=EXIT_CODES)
def channel_revoke(
    directory: Dir,
    version: Annotated[str, typer.Argument(metavar="VERSION")],
    reason: Annotated[str, typer.Option("--reason", metavar="TEXT",
                                        help="Why: shown by each node's status.")],
    keys: Keys,
    days: Days = 30,
    as_json: Json = False,
) -> None:
    """Revoke a release: no node takes it, and nodes running it go, judged, to the newest version
    eligible for them.

    Example: agent-fsm channel revoke ./stable 1.1.0 --reason "leaks memory" --key ci=./ci
    """
    from ...actions.channel.publishing import revoke

    _show(revoke(directory, version, reason, keys=_keys(keys, "--key"), now=_now(), days=days),
          as_json)


@app.command("refresh", epilog=EXIT_CODES)
def channel_refresh(directory: Dir, keys: Keys, days: Days = 30, as_json: Json = False) -> None:
    """Sign the index again with a new expiry, nothing else changed. Run it from CI well before the
    index expires: nodes refuse an expired index as frozen.

    Example: agent-fsm channel refresh ./stable --key ci=./ci_ed25519
    """
    from ...actions.channel.publishing import refresh

    _show(refresh(directory, keys=_keys(keys, "--key"), now=_now(), days=days), as_json)


@app.command("rotate", epilog=EXIT_CODES)
def channel_rotate(
    directory: Dir,
    root_keys: Annotated[list[str], typer.Option(
        "--root-key", metavar="NAME=FILE", help="A key of the new root for roots; repeat.")],
    index_keys: Annotated[list[str], typer.Option(
        "--index-key", metavar="NAME=FILE", help="A key of the new root for the index; repeat.")],
    sign_with: Annotated[list[str], typer.Option(
        "--sign", metavar="NAME=FILE", help="A key that signs the new root: enough of the old "
        "root's keys and of the new one's; repeat.")],
    threshold: Annotated[int, typer.Option("--threshold", min=1)] = 1,
    as_json: Json = False,
) -> None:
    """Publish the next root, naming new keys (a lost primary replaced by its backup, a new CI key).
    Nodes follow the chain of roots by themselves.

    Example: agent-fsm channel rotate ./stable --root-key backup=./backup --index-key ci2=./ci2
    --sign backup=./backup
    """
    from ...actions.channel.publishing import rotate

    _show(rotate(directory, root_keys=_keys(root_keys, "--root-key"),
                 index_keys=_keys(index_keys, "--index-key"),
                 sign_with=_keys(sign_with, "--sign"), threshold=threshold, now=_now()), as_json)


@app.command("show", epilog=EXIT_CODES)
def channel_show(directory: Dir, as_json: Json = False) -> None:
    """Show the channel in DIR, signatures checked: each release, its rollout, not-before time,
    revocation, digest and where nodes fetch it.

    Example: agent-fsm channel show ./stable
    """
    from ...actions.channel.publishing import read

    _show(read(directory), as_json)
