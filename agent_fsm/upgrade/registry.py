"""The tables the engine is given, built from one list, and the definition checked against them.

`CONDITIONS` and `EFFECTS` list every `(effectors, step)` function under the name the definition
uses; `load_definition` refuses a name not listed. A condition returns None or the refusing
error. An effect is idempotent: a crash before its progress is recorded runs it again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from ..errors import AgentFsmError
from ..machine import definition as definition_mod
from ..machine.definition import Definition
from ..machine.engine import Step
from ..machine.vocabulary import check_vocabulary
from . import assets, gate, known_bad, overrides, releases, results, signal, units
from .effectors import Effectors

Effect = Callable[[Effectors, Step], None]
Condition = Callable[[Effectors, Step], AgentFsmError | None]
F = TypeVar("F", Effect, Condition)


def _by_name(*fns: F) -> Mapping[str, F]:
    """Each function under its name, the name the definition gives it."""
    names = [fn.__name__ for fn in fns]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:  # two modules' functions of one name: the definition could not tell them apart
        raise AssertionError(f"more than one callback is named {', '.join(repeated)}")
    return dict(zip(names, fns, strict=True))


CONDITIONS: Mapping[str, Condition] = _by_name(
    gate.gate_open,
    signal.no_upgrade_pending, signal.upgrade_signalled,
    releases.release_exists, releases.not_selected, releases.last_good_selected,
    overrides.not_held, overrides.not_inhibited, overrides.not_known_bad,
    units.recovery_idle,
    assets.settings_apply,
)

EFFECTS: Mapping[str, Effect] = _by_name(
    gate.close_gate, gate.open_gate,
    signal.write_signal, signal.adopt_signal, signal.clear_signal, signal.count_attempt,
    releases.select_release, releases.select_last_good, releases.promote_last_good,
    assets.hold_assets, assets.write_assets, assets.converge_assets,
    units.reset_start_limit, units.restart_unit, units.enable_unit, units.start_recovery,
    units.reload_systemd, units.reload_systemd_if_changed,
    results.publish_result, results.record_result,
    known_bad.mark_known_bad, known_bad.clear_known_bad,
)


def load_definition(text: str | None = None, source: str = "<text>") -> Definition:
    """The shipped definition, checked against the code's effects, conditions, states and triggers.

    Another machine's `text` (tests, benchmarks) is checked against effects and conditions only.
    """
    shipped = text is None
    if text is None:
        text, source = definition_mod.default_text()
    d = definition_mod.parse(text, source, effects=EFFECTS, conditions=CONDITIONS)
    if shipped:
        check_vocabulary(d)
    return d
