"""The mutation link: every one-step variant of states/agent-upgrade.toml that `make mutants`
makes (tools/mutants.py's `variants`), model-checked at the `mutant` bound. A variant is
*caught* when it is refused at load or breaks a rule; *equivalent* when no rule breaks and every
configuration reached shows the same as the shipped definition's (the same reachable
behaviour); else it *survived*."""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent_fsm.errors import AgentFsmError
from agent_fsm.machine import definition as definition_mod

from .search import BOUNDS, Result, check

TOOL = Path(__file__).resolve().parents[2] / "tools" / "mutants.py"


@dataclass(frozen=True)
class Verdict:
    id: str
    outcome: str  # caught, equivalent, survived
    why: str
    seconds: float


def _variants() -> list[Any]:
    spec = importlib.util.spec_from_file_location("agent_fsm_mutants_tool", TOOL)
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = tool  # its dataclasses look their module up
    spec.loader.exec_module(tool)
    text, _ = definition_mod.default_text()
    return list(tool.variants(text))


def run(only: Callable[[str], bool] = lambda _id: True) -> Iterator[Verdict]:
    """Check the shipped definition, then each variant; yield a verdict per variant."""
    bound = BOUNDS["mutant"]
    shipped = check(bound)
    _, source = definition_mod.default_text()
    for v in _variants():
        if not only(v.id):
            continue
        began = time.monotonic()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(definition_mod, "default_text", lambda text=v.text: (text, source))
            try:
                result: Result | None = check(bound)
                why = ""
            except AgentFsmError as exc:
                result, why = None, f"refused at load: {exc}"
            except Exception as exc:
                result, why = None, f"the code fails on it: {type(exc).__name__}: {exc}"
        if result is None:
            outcome = "caught"
        elif result.violations:
            outcome, why = "caught", ", ".join(sorted({x.name for x in result.violations}))
        elif result.behaviour == shipped.behaviour:
            outcome, why = "equivalent", "the same reachable behaviour"
        else:
            outcome, why = "survived", "no rule broken, other reachable behaviour"
        yield Verdict(v.id, outcome, why, time.monotonic() - began)
