"""One finding of `agent-fsm doctor`: what was checked, how it stands, and what to do."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Level = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class Finding:
    check: str
    level: Level
    detail: str
    fix: str = ""

    def to_json(self) -> dict[str, str]:
        return {"check": self.check, "level": self.level, "detail": self.detail, "fix": self.fix}
