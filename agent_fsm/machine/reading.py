"""The shipped definition as readers load it, without importing the engine or the effects.

Writers load it through `upgrade.registry.load_definition`, which also checks every effect and
condition against the code that runs them. A reader (`status`) runs none, so it takes those
names as given. The other checks are the same: `definition.checked` and `check_vocabulary`.
"""

from __future__ import annotations

from typing import Any

from . import definition as definition_mod
from .definition import Definition
from .vocabulary import check_vocabulary


def _named(data: dict[str, Any], key: str) -> set[str]:
    """The names a definition's transitions give under `key`; anything else is left for `parse`."""
    out: set[str] = set()
    transitions = data.get("transitions")
    for raw in transitions if isinstance(transitions, list) else ():
        value = raw.get(key, []) if isinstance(raw, dict) else []
        for item in [value] if isinstance(value, str) else value if isinstance(value, list) else ():
            name = item.get("name") if isinstance(item, dict) else item
            if isinstance(name, str):
                out.add(name)
    return out


def shipped() -> Definition:
    """The shipped definition, checked as a reader needs it."""
    text, source = definition_mod.default_text()
    data = definition_mod.loads(text, source)  # once: parsing it costs ~1.4 ms of every `status`
    d = definition_mod.checked(data, source, effects=_named(data, "effects"),
                               conditions=_named(data, "conditions"))
    check_vocabulary(d)
    return d
