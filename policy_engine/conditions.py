"""Policy conditions in CEL (cel-python): no loops, no I/O, no Python ``eval`` of policy text."""

from __future__ import annotations

from collections.abc import Mapping

import celpy
from celpy import celtypes
from celpy.evaluation import CELEvalError


class ConditionError(ValueError):
    """A condition that does not parse, or does not evaluate to a boolean."""


class CompiledCondition:
    def __init__(self, expression: str) -> None:
        self.expression = expression
        environment = celpy.Environment()
        try:
            self._program = environment.program(environment.compile(expression))
        except Exception as exc:  # celpy raises its own parse errors
            raise ConditionError(f"cannot compile {expression!r}: {exc}") from None

    def holds(self, features: Mapping[str, float]) -> bool:
        """True when the condition holds; a feature the target lacks makes it not hold."""
        return self.outcome(features) is True

    def outcome(self, features: Mapping[str, float]) -> bool | None:
        """The condition's answer, or None where it cannot be told (a feature it needs is
        missing and nothing else settles it, CEL's ``true || error`` rule aside)."""
        try:
            result = self._program.evaluate(celpy.json_to_cel(dict(features)))
        except CELEvalError:
            return None
        if isinstance(result, CELEvalError):
            return None
        if not isinstance(result, bool | celtypes.BoolType):
            raise ConditionError(f"{self.expression!r} gave {type(result).__name__}, not bool")
        return bool(result)
