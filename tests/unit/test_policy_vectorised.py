"""The numpy-compiled conditions and cel-python agree, row for row, on a shared corpus."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsec.policy_engine.builtin import load_builtin_policies
from dsec.policy_engine.conditions import ConditionError
from dsec.policy_engine.vectorised import VectorCondition

NAMES = ("a", "b", "c")
CORPUS = [
    "a > 1.0 || b > 1.0",
    "a > 1 && b < 3.0",
    "!(a > 1.0)",
    "a > 1.0 ? b > 0.0 : true",
    "a + 1.0 > 2.0",
    "-a < -1.5",
    "a / 0.0 > 1.0",
    "a / 4.0 > 0.1",
    "a / b >= c",
    "(a - b) * c != 0.0",
    "a == 2",
    "a == 2.0 && !(b != c)",
    "true",
    "false || a <= 0.5",
    "a > 1.0 == (b > 1.0)",
    "size('abc') > 2",
    "missing > 1.0 || a > 0.0",
    "missing > 1.0 && a > 100.0",
]

doubles = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False).map(lambda v: round(v, 3))
small_ints = st.integers(min_value=-5, max_value=5)


def _numbers():
    leaf = st.one_of(
        st.sampled_from(NAMES),
        doubles.map(lambda v: f"{v!r}"),
        small_ints.map(str),
    )
    return st.recursive(
        leaf,
        lambda inner: st.one_of(
            st.tuples(inner, st.sampled_from(["+", "-", "*", "/"]), inner).map(
                lambda t: f"({t[0]} {t[1]} {t[2]})"),
            inner.map(lambda e: f"-({e})"),
        ),
        max_leaves=4,
    )


def _booleans():
    comparison = st.tuples(
        _numbers(), st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), _numbers()
    ).map(lambda t: f"{t[0]} {t[1]} {t[2]}")
    leaf = st.one_of(comparison, st.sampled_from(["true", "false"]))
    return st.recursive(
        leaf,
        lambda inner: st.one_of(
            st.tuples(inner, st.sampled_from(["&&", "||"]), inner).map(
                lambda t: f"({t[0]} {t[1]} {t[2]})"),
            inner.map(lambda e: f"!({e})"),
            st.tuples(inner, inner, inner).map(lambda t: f"({t[0]} ? {t[1]} : {t[2]})"),
        ),
        max_leaves=6,
    )


def _columns(rows: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    columns = {}
    for name in NAMES:
        values = rng.choice([-2.0, -1.0, 0.0, 0.5, 1.0, 2.0, 3.0, 1e5], size=rows)
        values[rng.random(rows) < 0.2] = np.nan  # some targets lack the feature
        columns[name] = values
    return columns


def _agree(expression: str, columns: dict[str, np.ndarray], rows: int) -> None:
    """The compiled and the row-by-row paths agree on the answer and on the rows whose
    answer cannot be told for want of a feature."""
    condition = VectorCondition(expression)
    compiled, scalar = condition.evaluate(columns, rows), condition.evaluate_scalar(columns, rows)
    for what, mine, reference in zip(("holds", "known"), compiled, scalar, strict=True):
        np.testing.assert_array_equal(
            mine, reference, err_msg=f"{what}: {expression} (vectorised={condition.vectorised})")


@pytest.mark.parametrize("expression", CORPUS)
def test_corpus_agrees(expression: str) -> None:
    _agree(expression, _columns(64, 0), 64)


def test_builtin_conditions_are_compiled_and_agree() -> None:
    columns = _columns(32, 1)
    for policy in load_builtin_policies():
        for expression in filter(None, (policy.condition, policy.exit_condition)):
            condition = VectorCondition(expression)
            assert condition.vectorised, (policy.name, condition.not_covered)
            names = {name: columns[NAMES[i % 3]] for i, name in enumerate(condition.names)}
            params = {k: np.full(32, v) for k, v in policy.params.items()}
            _agree(expression, {**names, **params}, 32)


# cel-python's parser raises the recursion limit; hypothesis notes it, harmlessly.
@pytest.mark.filterwarnings("ignore:The recursion limit will not be reset")
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expression=_booleans(), seed=st.integers(0, 2**16))
def test_random_expressions_agree(expression: str, seed: int) -> None:
    _agree(expression, _columns(16, seed), 16)


def test_uncovered_expressions_fall_back_and_non_boolean_is_refused() -> None:
    assert not VectorCondition("size('abc') > 2").vectorised
    assert VectorCondition("a > 1.0").vectorised
    with pytest.raises(ConditionError, match="not bool"):
        VectorCondition("a + 1.0")
    with pytest.raises(ConditionError):
        VectorCondition("a >")
