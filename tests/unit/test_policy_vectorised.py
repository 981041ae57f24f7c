"""The numpy-compiled conditions and cel-python agree, row for row, on a shared corpus and on
every built-in condition (random expressions: tests/fuzz/test_fuzz_policy_conditions.py)."""

from __future__ import annotations

import numpy as np
import pytest
from policy_conditions import CORPUS, NAMES, agree, columns

from dsec.policy_engine.builtin import load_builtin_policies
from dsec.policy_engine.conditions import ConditionError
from dsec.policy_engine.vectorised import VectorCondition


@pytest.mark.parametrize("expression", CORPUS)
def test_corpus_agrees(expression: str) -> None:
    agree(expression, columns(64, 0), 64)


def test_builtin_conditions_are_compiled_and_agree() -> None:
    data = columns(32, 1)
    for policy in load_builtin_policies():
        for expression in filter(None, (policy.condition, policy.exit_condition)):
            condition = VectorCondition(expression)
            assert condition.vectorised, (policy.name, condition.not_covered)
            names = {name: data[NAMES[i % 3]] for i, name in enumerate(condition.names)}
            params = {k: np.full(32, v) for k, v in policy.params.items()}
            agree(expression, {**names, **params}, 32)


def test_uncovered_expressions_fall_back_and_non_boolean_is_refused() -> None:
    assert not VectorCondition("size('abc') > 2").vectorised
    assert VectorCondition("a > 1.0").vectorised
    with pytest.raises(ConditionError, match="not bool"):
        VectorCondition("a + 1.0")
    with pytest.raises(ConditionError):
        VectorCondition("a >")
