"""`agent-fsm install`: select and trust a release, write all assets, reload, enable, start; with
--from, store it first (`release add`)."""

from __future__ import annotations

from typing import Annotated

import typer

from .. import options
from ..render import out


def install(
    ctx: typer.Context,
    version: Annotated[str | None, typer.Option(
        "--version", help="A stored release to install; with --from, the version it must be "
        "(default: its own).", show_default=False)] = None,
    source: Annotated[str | None, typer.Option(
        "--from", metavar="DIR|FILE.tar.gz|IMAGE", show_default=False,
        help="Store this release first, as `release add` does (a release directory, an archive "
             "of one, or an image), then install it.")] = None,
    no_start: Annotated[bool, typer.Option("--no-start", help="Write and reload only.")] = False,
) -> None:
    """Install a release: select and trust it, write all assets, reload, enable and start.

    The config's `bin_link` (default /usr/local/bin/agent-fsm) then runs the selected release's
    bin/agent-fsm. --from stores the release first, as `release add` does (other content under its
    version: exit 3); --version, if given, must match it (else exit 1). An empty node is
    bootstrapped by the release's own launcher: `DIR/bin/agent-fsm install --from DIR`
    (docs/your-agent.md).

    Example: agent-fsm install --version 1.0.0, or agent-fsm install --from ./agent-fsm-1.0.0
    """
    from ...actions.operations import install as do_install
    from ...errors import ReleaseError

    if source is None and version is None:
        raise typer.BadParameter("give --version V (a stored release) or --from DIR|IMAGE",
                                 param_hint="--version")
    node = options.of(ctx).node()
    if source is not None:
        from .release import add_from

        added = add_from(node, source)
        if version is not None and version != added.version:
            raise ReleaseError(
                f"{source} is release {added.version}, not --version {version}: nothing was "
                f"installed (it is stored; `agent-fsm release list` shows it); give "
                f"--version {added.version} or leave --version out")
        version = added.version
    assert version is not None
    out.print(do_install(node, version, start=not no_start).message, markup=False)
