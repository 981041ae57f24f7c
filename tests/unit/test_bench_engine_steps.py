"""The policy-eval bench's engine steps run from every source it times, the backlog's
ten events per target included."""

from __future__ import annotations

import pytest

from dsec.bench.policy_eval import engine_step_times_ms


@pytest.mark.parametrize("source", ["packed", "events", "wire", "columns", "backlog"])
def test_every_source_steps_the_engine(source: str) -> None:
    times_ms = engine_step_times_ms(100, source=source, steps=2)
    assert len(times_ms) == 2 and all(time_ms > 0 for time_ms in times_ms)
