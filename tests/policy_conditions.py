"""Shared by the unit and fuzz tests of the compiled policy conditions: column data with
missing features, random boolean expressions over them, and the check that the compiled and
the row-by-row (cel-python) paths agree."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

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


def numbers() -> st.SearchStrategy[str]:
    """Arithmetic over the feature names and constants."""
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


def booleans() -> st.SearchStrategy[str]:
    """Comparisons of ``numbers()`` under and, or, not and the conditional."""
    comparison = st.tuples(
        numbers(), st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), numbers()
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


def columns(rows: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    data = {}
    for name in NAMES:
        values = rng.choice([-2.0, -1.0, 0.0, 0.5, 1.0, 2.0, 3.0, 1e5], size=rows)
        values[rng.random(rows) < 0.2] = np.nan  # some targets lack the feature
        data[name] = values
    return data


def agree(expression: str, columns: dict[str, np.ndarray], rows: int) -> None:
    """The compiled and the row-by-row paths agree on the answer and on the rows whose
    answer cannot be told for want of a feature."""
    condition = VectorCondition(expression)
    compiled, scalar = condition.evaluate(columns, rows), condition.evaluate_scalar(columns, rows)
    for what, mine, reference in zip(("holds", "known"), compiled, scalar, strict=True):
        np.testing.assert_array_equal(
            mine, reference, err_msg=f"{what}: {expression} (vectorised={condition.vectorised})")
