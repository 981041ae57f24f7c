"""Random boolean expressions over features some targets lack: the numpy-compiled path and
cel-python's row-by-row evaluation agree on every row, answer and "cannot tell" alike."""

from __future__ import annotations

import pytest
from fuzzing import fuzz
from hypothesis import given
from hypothesis import strategies as st
from policy_conditions import agree, booleans, columns


# cel-python's parser raises the recursion limit; hypothesis notes it, harmlessly.
@pytest.mark.filterwarnings("ignore:The recursion limit will not be reset")
@fuzz(400)
@given(expression=booleans(), seed=st.integers(0, 2**16))
def test_random_expressions_agree(expression: str, seed: int) -> None:
    agree(expression, columns(16, seed), 16)
