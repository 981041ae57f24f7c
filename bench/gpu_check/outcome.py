"""What one check found: ok, failed or skipped, why, and its figures."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["ok", "failed", "skipped"]


@dataclass(frozen=True)
class Outcome:
    status: Status
    reason: str = ""
    figures: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def judged(cls, problems: list[str], figures: dict[str, Any]) -> Outcome:
        """ok without problems, else failed with every problem as the reason."""
        if problems:
            return cls("failed", "; ".join(problems), figures)
        return cls("ok", "", figures)
