"""Hypothesis settings of the fuzz tests (tests/fuzz/test_fuzz_*.py).

Derandomized, so a CI run tries the same inputs every time and a failure reproduces; no
deadline (a loaded machine must not fail a test), with each decoder's own time bound in
``dsec.bench.fuzz_targets`` catching a hang instead. ``DSEC_FUZZ=long`` runs twenty times
the examples with a fresh seed each run; ``dsec bench fuzz`` runs them for a fixed time.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from dsec.bench.fuzz_targets import prepare

settings.register_profile(
    "dsec-fuzz",
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=(HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much, HealthCheck.large_base_example),
)
settings.register_profile("dsec-fuzz-long", parent=settings.get_profile("dsec-fuzz"),
                          derandomize=False)
LONG = os.environ.get("DSEC_FUZZ") == "long"
_PROFILE = settings.get_profile("dsec-fuzz-long" if LONG else "dsec-fuzz")


def fuzz(max_examples: int) -> settings:
    """The profile with ``max_examples`` (twenty times that with ``DSEC_FUZZ=long``)."""
    return settings(_PROFILE, max_examples=max_examples * (20 if LONG else 1))


def drawn(strategy: st.SearchStrategy[Any], count: int) -> list[Any]:
    """``count`` values of ``strategy``, the same ones every run (inputs for a test that is
    not a property test, such as a burst through a running stack)."""
    values: list[Any] = []

    @settings(_PROFILE, max_examples=count, phases=[Phase.generate])
    @given(strategy)
    def collect(value: Any) -> None:
        values.append(value)

    collect()
    return values


prepare()  # before any test: see its docstring
