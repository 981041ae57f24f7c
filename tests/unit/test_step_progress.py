"""Liveness from step progress: heartbeats that keep coming with a step count that does
not move are a stalled worker, which silence-based liveness does not see."""

from __future__ import annotations

import numpy as np

from dsec.stream_jobs.step_progress import step_progress
from dsec.stream_jobs.worker_state import Heartbeat, WorkerState


def _beats(state: Heartbeat, steps: list[int], now_ms: int) -> tuple[Heartbeat, dict]:
    out: dict[str, float] = {}
    return step_progress(state, np.asarray(steps), now_ms, out), out


def test_a_worker_that_beats_without_stepping_is_stalled_and_recovers_when_it_steps() -> None:
    state, out = _beats(Heartbeat(), [10], 1_000)
    assert out == {"step_stalled_heartbeats": 0.0, "step_stalled_s": 0.0}
    state, out = _beats(state, [10, 10], 5_000)
    assert out == {"step_stalled_heartbeats": 2.0, "step_stalled_s": 4.0}
    state, out = _beats(state, [10], 7_000)
    assert out["step_stalled_heartbeats"] == 3.0 and out["step_stalled_s"] == 6.0
    state, out = _beats(state, [11], 9_000)
    assert out == {"step_stalled_heartbeats": 0.0, "step_stalled_s": 0.0}


def test_starting_up_is_not_stalling_and_a_restart_counts_as_a_move() -> None:
    state, out = _beats(Heartbeat(), [0, 0, 0], 1_000)
    assert out["step_stalled_heartbeats"] == 0.0
    state, _ = _beats(state, [40], 2_000)
    state, out = _beats(state, [0], 3_000)  # a replacement process counts from 0
    assert out["step_stalled_heartbeats"] == 0.0


def test_the_state_round_trips_with_its_step_progress() -> None:
    state = WorkerState(heartbeat=Heartbeat(last_seen_ms=5, last_step=3, step_changed_ms=4,
                                            stalled_beats=2))
    assert WorkerState.from_bytes(state.to_bytes()).heartbeat == state.heartbeat
    # a state stored before step progress was kept reads back with none
    old = state.to_json()
    for name in ("last_step", "step_changed_ms", "stalled_beats"):
        del old["heartbeat"][name]
    assert WorkerState.from_json(old).heartbeat.stalled_beats == 0
