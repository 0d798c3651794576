"""The tables the engine is given: every effect and condition by name (filled by
`upgrade.effects` as it is imported), and the definition checked against them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import AgentFsmError
from ..machine import definition as definition_mod
from ..machine.definition import Definition
from ..machine.engine import Step
from ..machine.vocabulary import check_vocabulary

if TYPE_CHECKING:
    from .effects import Host

Effect = Callable[["Host", Step], None]
Condition = Callable[["Host", Step], AgentFsmError | None]
EFFECTS: dict[str, Effect] = {}
CONDITIONS: dict[str, Condition] = {}


def effect(fn: Effect) -> Effect:
    EFFECTS[fn.__name__] = fn
    return fn


def condition(fn: Condition) -> Condition:
    CONDITIONS[fn.__name__] = fn
    return fn


def load_definition(text: str | None = None, source: str = "<text>") -> Definition:
    """The shipped definition, checked against the effects and conditions the code has and
    the state and trigger names it uses; or another machine's `text` (tests, benchmarks),
    checked against the effects and conditions only."""
    from . import effects  # noqa: F401  (its import fills the tables)

    shipped = text is None
    if text is None:
        text, source = definition_mod.default_text()
    d = definition_mod.parse(text, source, effects=EFFECTS, conditions=CONDITIONS)
    if shipped:
        check_vocabulary(d)
    return d
