"""The policy-eval bench's engine steps run from every source it times, the backlog's
ten events per target included."""

from __future__ import annotations

import pytest

from dsec.bench.policy_eval import engine_step_times_ms


@pytest.mark.parametrize("source", ["packed", "events", "wire", "columns", "backlog"])
def test_every_source_steps_the_engine(source: str) -> None:
    times_ms = engine_step_times_ms(100, source=source, steps=2)
    assert len(times_ms) == 2 and all(time_ms > 0 for time_ms in times_ms)


def test_snapshot_rounds_compare_the_jittered_and_unjittered_periodic_snapshot() -> None:
    from dsec.bench.snapshot_rounds import snapshot_rounds

    result = snapshot_rounds(200, minutes=6, window_min=3)
    for arm in ("jittered", "unjittered"):
        assert result[arm]["first_round_snapshots"] == 200  # every worker at first sight
    # Without jitter each round is the whole fleet in one step; with it, never.
    assert result["unjittered"]["last_window_max_snapshots_per_step"] == 200
    assert result["jittered"]["last_window_max_snapshots_per_step"] < 100
