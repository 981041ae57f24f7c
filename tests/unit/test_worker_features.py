"""Per-worker features on synthetic traces with known answers (pure, no broker)."""

from __future__ import annotations

import pytest

from dsec.bench.traces import (
    TraceIdentity,
    grad_norm_decay,
    leak_on_long_episodes,
    reward_variance_jump,
)
from dsec.schemas.frames import batch_frames
from dsec.stream_jobs import worker_features
from dsec.stream_jobs.worker_features import FeatureConfig
from dsec.stream_jobs.worker_state import WorkerState

CONFIG = FeatureConfig()
NO_GRACE = FeatureConfig(lost_grace_s=0.0)


def _run(batches):
    state = WorkerState()
    outputs = []
    for offset, batch in enumerate(batches):
        update = worker_features.update(
            state, batch_frames(batch), 0, offset, batch.event_time_ms, CONFIG)
        state = update.state
        outputs.append(update)
    return state, outputs


def test_leak_on_long_episodes_only() -> None:
    leak = 2_000_000.0
    _state, outputs = _run(leak_on_long_episodes(TraceIdentity(), leak_bytes_per_s=leak))
    regimes = outputs[-1].gpus[0].regimes
    long_bytes, long_s = regimes["long"]
    short_bytes, short_s = regimes["short"]
    assert long_bytes / long_s == pytest.approx(leak, rel=0.02)
    assert short_bytes / short_s == pytest.approx(0.0, abs=1.0)
    assert long_s > 55 and short_s > 55  # two phases of 30 s each, less the switch pairs


def test_reward_variance_jump_is_seen_right_after_the_jump() -> None:
    window = CONFIG.reward_window_episodes
    _state, outputs = _run(reward_variance_jump(TraceIdentity(), jump_at_episode=200,
                                                episodes=400))
    episodes_seen, first_jump = 0, None
    for update in outputs:
        episodes_seen += 10
        if update.features.get("reward_variance_jump_ratio", 0) > 4 and first_jump is None:
            first_jump = episodes_seen
    assert first_jump is not None
    assert 200 < first_jump <= 200 + window


def test_grad_norm_log_slope() -> None:
    _state, outputs = _run(grad_norm_decay(TraceIdentity(), log_slope_per_step=-0.002,
                                           steps=1000))
    assert outputs[-1].features["grad_norm_log_slope"] == pytest.approx(-0.002, rel=1e-6)


def test_replayed_event_is_not_counted_twice() -> None:
    batch = reward_variance_jump(TraceIdentity(), jump_at_episode=5, episodes=10)[0]
    first = worker_features.update(WorkerState(), batch_frames(batch), 3, 41, 0, CONFIG)
    again = worker_features.update(first.state, batch_frames(batch), 3, 41, 0, CONFIG)
    assert again.skipped and again.state == first.state
    assert len(first.state.episodes.rewards) == 10


def test_an_event_handed_over_ahead_of_its_turn_does_not_hide_the_ones_before_it() -> None:
    # After a rebalance a consumer may get one prefetched event (offset 50) before it
    # reads on from its committed position (offset 42): 42..49 still count, 50 once.
    batch = reward_variance_jump(TraceIdentity(), jump_at_episode=5, episodes=10)[0]
    frames = batch_frames(batch)
    state = worker_features.update(WorkerState(), frames, 3, 41, 0, CONFIG).state
    state = worker_features.update(state, frames, 3, 50, 0, CONFIG).state
    for offset in (42, 45, 49):
        step = worker_features.update(state, frames, 3, offset, 0, CONFIG)
        assert not step.skipped
        state = step.state
    assert worker_features.update(state, frames, 3, 50, 0, CONFIG).skipped
    assert worker_features.update(state, frames, 3, 45, 0, CONFIG).skipped


def test_offsets_below_a_full_window_count_as_seen() -> None:
    state = WorkerState()
    frames = batch_frames(grad_norm_decay(TraceIdentity(), -0.01, steps=10)[0])
    for offset in range(100, 100 + 2 * (worker_features.RECENT_OFFSETS + 8), 2):
        state = worker_features.update(state, frames, 0, offset, 0, CONFIG).state
    assert worker_features.update(state, frames, 0, 101, 0, CONFIG).skipped
    assert not worker_features.update(state, frames, 0, 227, 0, CONFIG).skipped
    legacy = WorkerState.from_json({"offsets": {"0": 70}})  # a state from before the window
    assert worker_features.update(legacy, frames, 0, 70, 0, CONFIG).skipped
    assert not worker_features.update(legacy, frames, 0, 71, 0, CONFIG).skipped


def test_liveness_lost_once_then_back_on_heartbeat() -> None:
    batch = grad_norm_decay(TraceIdentity(), -0.01, steps=10)[0]  # heartbeat interval 1 s
    state = worker_features.update(WorkerState(), batch_frames(batch), 0, 0, 10_000, CONFIG).state
    last_event_ms = state.heartbeat.last_event_ms
    assert last_event_ms == max(batch.columns.heartbeat.event_time_ms)

    def on(now_ms: int):  # the others go on, their event times keeping pace with the clock
        return dict(now_ms=now_ms, config=NO_GRACE, progress_ms=last_event_ms + now_ms - 10_000)

    state, lost = worker_features.liveness(state, **on(12_000))
    assert lost is None
    state, lost = worker_features.liveness(state, **on(13_500))
    assert lost == {"worker_lost": 1.0, "heartbeat_age_s": 3.5}
    state, lost = worker_features.liveness(state, **on(20_000))
    assert lost is None  # reported once
    back = worker_features.update(state, batch_frames(batch), 0, 1, 21_000, CONFIG)
    assert back.features["worker_lost"] == 0.0 and back.state.heartbeat.lost is False
    assert back.state.heartbeat.overdue_since_ms is None


def test_a_worker_is_not_lost_while_its_partition_has_unread_messages() -> None:
    batch = grad_norm_decay(TraceIdentity(), -0.01, steps=10)[0]  # heartbeat interval 1 s
    state = worker_features.update(WorkerState(), batch_frames(batch), 0, 0, 10_000, CONFIG).state
    progress_ms = state.heartbeat.last_event_ms + 20_000
    behind, lost = worker_features.liveness(state, 30_000, NO_GRACE, caught_up=False,
                                            progress_ms=progress_ms)
    assert lost is None and not behind.heartbeat.lost
    _, lost = worker_features.liveness(behind, 30_000, NO_GRACE, caught_up=True,
                                       progress_ms=progress_ms)
    assert lost == {"worker_lost": 1.0, "heartbeat_age_s": 20.0}


def test_a_worker_is_not_lost_while_nothing_arrives_from_anyone_up_to_the_stall_limit() -> None:
    batch = grad_norm_decay(TraceIdentity(), -0.01, steps=10)[0]  # heartbeat interval 1 s
    state = worker_features.update(WorkerState(), batch_frames(batch), 0, 0, 10_000, CONFIG).state
    stalled_ms = state.heartbeat.last_event_ms  # the stream got no further than this worker
    for now_ms in (15_000, 40_000, 73_000):  # read at 10 s; timeout 3 s, stall limit 60 s
        state, lost = worker_features.liveness(state, now_ms, NO_GRACE, progress_ms=stalled_ms)
        assert lost is None and state.heartbeat.overdue_since_ms is None
    # longer than any stall: every worker of the job died at once
    state, lost = worker_features.liveness(state, 73_001, NO_GRACE, progress_ms=stalled_ms)
    assert lost is not None and lost["worker_lost"] == 1.0


def test_an_overdue_worker_is_lost_after_the_grace_unless_heard_from() -> None:
    batch = grad_norm_decay(TraceIdentity(), -0.01, steps=10)[0]  # heartbeat interval 1 s
    state = worker_features.update(WorkerState(), batch_frames(batch), 0, 0, 10_000, CONFIG).state
    progress_ms = state.heartbeat.last_event_ms + 30_000  # the stream came back at once
    overdue, lost = worker_features.liveness(state, 30_000, CONFIG, progress_ms=progress_ms)
    assert lost is None and overdue.heartbeat.overdue_since_ms == 30_000
    heard = worker_features.update(overdue, batch_frames(batch), 0, 1, 30_500, CONFIG).state
    _, lost = worker_features.liveness(heard, 32_000, CONFIG, progress_ms=progress_ms)
    assert lost is None  # its backlog came in within the grace
    _, lost = worker_features.liveness(overdue, 32_000, CONFIG, progress_ms=progress_ms)
    assert lost == {"worker_lost": 1.0, "heartbeat_age_s": 22.0}


def test_the_last_ending_is_tagged_for_alerts() -> None:
    from dsec.schemas import MetricBatch, MetricColumns
    from dsec.schemas.metrics import EpisodeColumns

    batch = MetricBatch(identity=TraceIdentity().worker(), columns=MetricColumns(
        episode=EpisodeColumns(event_time_ms=[1, 2, 3], episode_index=[0, 1, 2],
                               reward=[1.0] * 3, length=[5] * 3,
                               termination_reason=["collision_x12"] * 3)))
    update = worker_features.update(WorkerState(), batch_frames(batch), 0, 0, 0, CONFIG)
    assert update.features["episode_same_end_streak"] == 3.0
    assert update.tags == {"episode_end_reason": "collision_x12"}


def test_totals_for_the_fleet_count_syncs_failures_and_snapshot_resumes() -> None:
    from dsec.bench.traces import slow_grad_sync

    batches = slow_grad_sync(TraceIdentity(), seconds=5, latency_ms=20.0, syncs_per_s=10,
                             failed_every=4, recovery_time_s=6.5)
    state, outputs = _run(batches)
    last = outputs[-1].features
    assert last["grad_syncs_total"] == 50
    assert last["grad_syncs_failed_total"] == 12  # every 4th of 50
    assert outputs[0].features["snapshot_recoveries_total"] == 1
    assert outputs[0].features["snapshot_recovery_time_s_total"] == 6.5
    assert outputs[0].tags["recovery_source"] == "snapshot"
    assert state.recoveries.total == 1 and "recoveries_total" not in last


def test_step_time_covers_the_steps_between_samples() -> None:
    from dsec.bench.traces import training_batch

    # 3 batches of 100 consecutive steps, each sample 2 ms a step: the first sample has
    # no step before it, so 299 steps are covered.
    batches = [training_batch(TraceIdentity(), index, samples=100) for index in range(3)]
    state, outputs = _run(batches)
    assert outputs[-1].features["step_time_s_total"] == pytest.approx(299 * 0.002)
    assert state.steps.last_sampled_step == 299


def test_step_time_spans_unsampled_steps() -> None:
    import numpy as np

    from dsec.schemas.frames import Frame

    frame: Frame = {
        "event_time_ms": np.array([1, 2]), "step": np.array([10, 20]),
        "loss": np.array([1.0, 1.0]), "grad_norm": np.array([np.nan, np.nan]),
        "loss_nonfinite": np.array([False, False]), "grad_nonfinite": np.array([False, False]),
        "step_time_ms": np.array([5.0, 4.0]),
        "grad_norm_source": np.array([None, None], dtype=object),
    }
    state = WorkerState()
    update = worker_features.update(state, {"step": frame}, 0, 0, 0, CONFIG)
    update = worker_features.update(
        update.state, {"step": {**frame, "step": np.array([25, 30])}}, 0, 1, 0, CONFIG)
    # 10 steps at 4 ms, then 5 at 5 ms and 5 at 4 ms
    assert update.features["step_time_s_total"] == pytest.approx(0.040 + 0.025 + 0.020)
