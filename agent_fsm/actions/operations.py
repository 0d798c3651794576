"""The operator's commands that write all assets: install and activate (without judgment).

`install` also keeps the follow timer (`upgrade.follow_timer`), after the transition. Each returns a
frozen result for the CLI to render; refusals and errors are raised.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..machine.vocabulary import Trigger
from ..node.assets import bin_link
from ..upgrade import follow_timer
from ..wiring import Node


@dataclass(frozen=True)
class Done:
    """What a command did, in one line, plus the state it left."""

    message: str
    state: str


def install(node: Node, version: str, *, start: bool = True) -> Done:
    doc = node.controller.fire(Trigger.install, release=version, no_start=not start)
    how = "enabled and restarted" if start else "not started (--no-start)"
    timer = follow_timer.keep_logged(node.effectors, start=start)
    return Done(f"installed {version}: all assets written, systemd reloaded, "
                f"{node.paths.agent_unit_name} {how}{_on_path(node)}"
                f"{'' if timer is None else '; ' + timer}", doc.state)


def activate(node: Node, version: str) -> Done:
    doc = node.controller.fire(Trigger.activate, release=version)
    return Done(f"activated {version} without judgment: all assets written, "
                f"{node.paths.agent_unit_name} restarted{_on_path(node)}", doc.state)


def _on_path(node: Node) -> str:
    """How `agent-fsm` on PATH stands after the assets were written (`bin_link`)."""
    link = bin_link.look(node.paths)
    if link.path is None:
        return ""
    if link.state == "ok":
        return f"; agent-fsm on PATH: {link.words()}"
    return f"; {link.words()}"
