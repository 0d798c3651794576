"""What a state means to an operator, in words taken from the definition."""

from __future__ import annotations

from ..node.store import StateDoc
from .definition import Definition


def situation(d: Definition, doc: StateDoc) -> str:
    """One line on what is going on in this state, for refusals and status."""
    up = doc.upgrade
    text = d.state(doc.state).situation or doc.state
    return text.format_map({"to": up.to_version if up else "?",
                            "from": up.from_version if up else "?"})
