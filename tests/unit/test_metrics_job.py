"""The metrics job as a stage, without Faust or a broker: records in, outputs and worker
states out, on traces with known answers."""

from __future__ import annotations

import orjson
import pytest

from dsec.bench.traces import (
    TraceIdentity,
    grad_norm_decay,
    leak_on_long_episodes,
    reward_variance_jump,
)
from dsec.infra.records import Record
from dsec.schemas import (
    DeadLetter,
    FeatureEvent,
    GpuProfileEvent,
    MetricBatch,
    WorkerIdentity,
    encode,
)
from dsec.schemas.feature_columns import feature_events
from dsec.schemas.policies import TargetSelector
from dsec.schemas.topics import topic_names
from dsec.stream_jobs.metrics_job import MetricsJob, derived_event_id
from dsec.stream_jobs.worker_features import FeatureConfig
from dsec.stream_jobs.worker_state import WorkerState, WorkerStateTable

TOPICS = topic_names("t")
IDENTITY = TraceIdentity()


def _records(batches: list[MetricBatch], partition: int = 0, first_offset: int = 0,
             ) -> list[Record]:
    return [Record(TOPICS.metrics, partition, first_offset + i,
                   batch.identity.worker_id.encode(), encode(batch))
            for i, batch in enumerate(batches)]


def _now_ms(batches: list[MetricBatch]) -> int:
    return max(batch.event_time_ms for batch in batches) + 1_000


def test_a_batch_gives_one_feature_event_per_record_with_the_known_slope() -> None:
    batches = grad_norm_decay(IDENTITY, log_slope_per_step=-0.002, steps=1000)
    job = MetricsJob(TOPICS, {})
    result = job.process(_records(batches), _now_ms(batches))
    assert result.per_record == [] and len(result.features) == len(batches)
    # one message of columns, under the worker's key, whose rows are the events
    (message,) = result.feature_columns
    assert (message.topic, message.key) == (TOPICS.features, b"worker-000")
    assert feature_events(message.value()) == result.features
    last = result.features[-1]
    assert isinstance(last, FeatureEvent)
    assert last.features["grad_norm_log_slope"] == pytest.approx(-0.002, rel=1e-6)
    assert last.features["steps_total"] == 1000.0
    assert last.event_id == derived_event_id("features", "worker-000", 0, len(batches) - 1)
    assert job.counters.features_out == len(batches) and job.counters.dead_letters == 0


def test_states_are_kept_only_when_saved_after_the_outputs() -> None:
    batches = reward_variance_jump(IDENTITY, jump_at_episode=5, episodes=40)
    states: dict[str, WorkerState] = {}
    job = MetricsJob(TOPICS, states)
    result = job.process(_records(batches), _now_ms(batches))
    assert states == {}  # nothing kept before the caller has published
    job.save(result.states)
    (state,) = states.values()
    assert state.episodes.episodes_total == 40
    assert state.identity == IDENTITY.worker() and state.partition == 0


def test_a_replayed_batch_gives_nothing_and_counts_nothing_twice() -> None:
    batches = reward_variance_jump(IDENTITY, jump_at_episode=5, episodes=40)
    states: dict[str, WorkerState] = {}
    job = MetricsJob(TOPICS, states)
    first = job.process(_records(batches), _now_ms(batches))
    job.save(first.states)
    again = job.process(_records(batches), _now_ms(batches))
    assert again.outputs == [] and again.states == {}
    assert job.counters.replayed_skipped == len(batches)
    assert states["worker-000"].episodes.episodes_total == 40


def test_a_batch_handled_again_after_a_failed_delivery_counts_once() -> None:
    """The agent handles a batch again until its outputs are delivered; only the
    delivered handling is saved and counted."""
    batches = grad_norm_decay(IDENTITY, log_slope_per_step=-0.01, steps=20)
    records = [Record(TOPICS.metrics, 0, 99, b"worker-000", b"{not json"), *_records(batches)]
    job = MetricsJob(TOPICS, {})
    for _attempt in range(3):
        batch = job.start_batch(_now_ms(batches))
        for record in records:
            batch.add(record)
        result = batch.finish()
        assert job.counters.messages_in == 0  # not delivered: nothing saved or counted
    job.save_batch(result)
    counted = job.counters
    assert (counted.messages_in, counted.dead_letters) == (len(records), 1)
    assert counted.features_out == len(batches) == result.counters.features_out
    assert counted.samples_in == result.counters.samples_in > 0
    assert job.states["worker-000"].identity == IDENTITY.worker()


def test_bad_records_are_dead_lettered_with_their_reason_and_the_batch_goes_on() -> None:
    batches = grad_norm_decay(IDENTITY, log_slope_per_step=-0.01, steps=20)
    bad = Record(TOPICS.metrics, 2, 7, b"worker-000", b"{not json")
    tombstone = Record(TOPICS.metrics, 2, 8, b"worker-000", None)
    job = MetricsJob(TOPICS, {})
    result = job.process([bad, *_records(batches), tombstone], _now_ms(batches))
    letters = [o for o in result.per_record if o.topic == TOPICS.dead_letters]
    assert [o.key for o in letters] == [TOPICS.metrics.encode()] * 2
    first, second = (o.event for o in letters)
    assert isinstance(first, DeadLetter) and isinstance(second, DeadLetter)
    assert (first.partition, first.offset, first.payload) == (2, 7, "{not json")
    assert "not JSON" in first.reason and "tombstone" in second.reason
    assert result.dead_letter_reasons == [first.reason, second.reason]
    assert len(result.per_record) == 2 and len(result.features) == len(batches)
    assert job.counters.dead_letters == 2


def test_samples_outside_the_stored_window_are_dead_lettered() -> None:
    batches = grad_norm_decay(IDENTITY, log_slope_per_step=-0.01, steps=10)
    result = MetricsJob(TOPICS, {}).process(_records(batches), batch_ms=0)
    assert {o.topic for o in result.per_record} == {TOPICS.dead_letters}
    assert result.states == {}


def test_one_gpu_profile_per_gpu_and_worker_with_the_known_leak() -> None:
    leak = 2_000_000.0
    batches = leak_on_long_episodes(IDENTITY, leak_bytes_per_s=leak)
    result = MetricsJob(TOPICS, {}).process(_records(batches), _now_ms(batches))
    (profile,) = result.gpu_profiles
    assert profile.topic == TOPICS.gpu_profiles
    assert profile.key == f"{IDENTITY.gpu_uuid}/worker-000".encode()
    event = profile.event
    assert isinstance(event, GpuProfileEvent)
    assert event.regimes["long"].delta_bytes / event.regimes["long"].delta_s == pytest.approx(
        leak, rel=0.02)
    assert event.event_id == derived_event_id("gpu", IDENTITY.gpu_uuid, "worker-000", 0,
                                              len(batches) - 1)
    # after the per-record outputs and the features, before the card reports
    assert result.outputs[len(result.per_record) + len(result.feature_columns)] is profile


def test_states_kept_as_table_bytes_give_the_same_outputs_as_kept_objects() -> None:
    batches = leak_on_long_episodes(IDENTITY, leak_bytes_per_s=1e6)
    table: dict[bytes, bytes] = {}
    in_objects = MetricsJob(TOPICS, {}, clock_ms=lambda: 1_000)
    in_bytes = MetricsJob(TOPICS, WorkerStateTable(table), clock_ms=lambda: 1_000)
    for start in range(0, len(batches), 7):
        chunk = _records(batches[start:start + 7], first_offset=start)
        results = [job.process(chunk, _now_ms(batches)) for job in (in_objects, in_bytes)]
        assert results[0].outputs == results[1].outputs
        for job, result in zip((in_objects, in_bytes), results, strict=True):
            job.save(result.states)
    assert list(table) == [b"worker-000"]
    assert WorkerState.from_bytes(table[b"worker-000"]) == in_objects.states["worker-000"]


def test_a_table_entry_of_before_is_read_and_carried_on() -> None:
    old = {"identity": IDENTITY.worker().model_dump(), "partition": 0,
           "recent_offsets": {"0": [0, 1]}, "rewards": [1.0, 2.0], "lengths": [10, 10],
           "reward_times_ms": [1, 2], "episodes_total": 2, "last_heartbeat_ms": 5,
           "gpus": {"GPU-0": {"model": "m", "last": [1, 100, "short"],
                              "growth": {"short": [10.0, 1.0]}, "samples": 3}}}
    states = WorkerStateTable({b"worker-000": orjson.dumps(old)})
    state = states["worker-000"]
    assert state.episodes.episodes_total == 2 and state.heartbeat.last_seen_ms == 5
    assert state.gpus["GPU-0"].growth_by_regime["short"].delta_bytes == 10.0
    assert state.recent_offsets == {0: [0, 1]}
    batches = reward_variance_jump(IDENTITY, jump_at_episode=5, episodes=30)  # 10 a batch
    result = MetricsJob(TOPICS, states).process(_records(batches, first_offset=1),
                                                _now_ms(batches))
    assert result.states["worker-000"].episodes.episodes_total == 2 + 20  # offset 1 was seen


def _others_go_on(job: MetricsJob, now_ms: int) -> None:
    """Another worker, on a partition of its own, heard from until ``now_ms``: the stream
    goes on while the worker under test is silent."""
    start_ms = now_ms - 3_000
    pacer = grad_norm_decay(TraceIdentity(worker_id="pacer", start_ms=start_ms), -0.01, steps=2)
    job.save(job.process(_records(pacer, partition=9, first_offset=job.counters.messages_in),
                         now_ms).states)


def test_liveness_reports_a_silent_worker_once_and_only_when_caught_up() -> None:
    batch = grad_norm_decay(IDENTITY, log_slope_per_step=-0.01, steps=10)  # 1 s heartbeats
    job = MetricsJob(TOPICS, {}, FeatureConfig(lost_grace_s=0.0))
    now_ms = _now_ms(batch)
    job.save(job.process(_records(batch, partition=3, first_offset=40), now_ms).states)
    last = 40 + len(batch) - 1
    _others_go_on(job, now_ms + 10_000)

    behind = job.check_liveness(now_ms + 10_000, lambda partition: last + 5)
    assert behind.outputs == [] and behind.lost_workers == 0
    unknown = job.check_liveness(now_ms + 10_000, lambda partition: None)
    assert unknown.outputs == []

    lost = job.check_liveness(now_ms + 10_000, lambda partition: last + 1)
    (output,) = lost.outputs
    assert output.event.features == {"worker_lost": 1.0, "heartbeat_age_s": 10.0}
    assert output.event.event_id == derived_event_id("lost", "worker-000", now_ms)
    assert lost.lost_workers == 1
    job.save(lost.states)
    _others_go_on(job, now_ms + 20_000)
    again = job.check_liveness(now_ms + 20_000, lambda partition: last + 1)
    assert again.outputs == [] and again.lost_workers == 1


def test_a_state_saved_by_a_batch_while_the_lost_event_is_published_is_kept() -> None:
    """The liveness check publishes (awaits) before it saves; a batch from the worker that
    lands in between saved a newer state, which the check's older one must not replace."""
    batch = grad_norm_decay(IDENTITY, log_slope_per_step=-0.01, steps=10)
    job = MetricsJob(TOPICS, WorkerStateTable({}), FeatureConfig(lost_grace_s=0.0))
    now_ms = _now_ms(batch)
    job.save(job.process(_records(batch, partition=3), now_ms).states)
    _others_go_on(job, now_ms + 10_000)
    lost = job.check_liveness(now_ms + 10_000, lambda partition: len(batch))
    assert lost.lost_workers == 1 and list(lost.states) == ["worker-000"]
    back = [b.model_copy(update={"event_id": f"worker-back-{i}"}) for i, b in enumerate(
        grad_norm_decay(TraceIdentity(worker_id="worker-000", start_ms=now_ms + 9_000),
                        -0.01, steps=2))]
    newer = job.process(_records(back, partition=3, first_offset=len(batch)), now_ms + 10_000)
    job.save(newer.states)
    job.save_lost(lost)
    assert job.states["worker-000"] == newer.states["worker-000"]
    assert job.states["worker-000"].heartbeat.lost == 0
    # Without a batch in between, the lost state is kept.
    again = MetricsJob(TOPICS, {}, FeatureConfig(lost_grace_s=0.0))
    again.save(again.process(_records(batch, partition=3), now_ms).states)
    _others_go_on(again, now_ms + 10_000)
    lost = again.check_liveness(now_ms + 10_000, lambda partition: len(batch))
    again.save_lost(lost)
    assert again.states["worker-000"] == lost.states["worker-000"]


def test_liveness_declares_nobody_lost_while_nothing_arrives_then_the_silent_one() -> None:
    job = MetricsJob(TOPICS, {})
    batches = {worker: grad_norm_decay(TraceIdentity(worker_id=worker), -0.01, steps=10)
               for worker in ("w0", "w1", "w2")}
    now_ms = max(_now_ms(b) for b in batches.values())
    for partition, batch in enumerate(batches.values()):
        job.save(job.process(_records(batch, partition=partition), now_ms).states)
    caught_up = {p: len(b) for p, b in enumerate(batches.values())}
    for later_s in (5, 30, 60):  # the input stalls (shorter than its 60 s limit)
        stalled = job.check_liveness(now_ms + later_s * 1000, caught_up.get)
        assert stalled.outputs == [] and stalled.overdue == {} and stalled.lost_workers == 0
    # w0 and w1 come back, their heartbeats 10 minutes on; w2 stays silent.
    for partition, worker in enumerate(("w0", "w1")):
        resumed = [batch.model_copy(update={"event_id": f"{worker}-resumed"}) for batch in
                   grad_norm_decay(TraceIdentity(worker_id=worker, start_ms=now_ms + 598_000),
                                   -0.01, steps=10)]
        job.save(job.process(_records(resumed, partition=partition, first_offset=10),
                             now_ms + 600_000).states)
        caught_up[partition] = 10 + len(resumed)
    overdue = job.check_liveness(now_ms + 600_500, caught_up.get)
    assert overdue.outputs == [] and list(overdue.overdue) == ["w2"]  # the grace: 2 s
    job.save(overdue.overdue)
    (lost,) = job.check_liveness(now_ms + 602_500, caught_up.get).outputs
    assert lost.key == b"w2" and lost.event.features["worker_lost"] == 1.0


def test_feature_events_carry_the_pool_gpu_model_and_labels_selectors_match() -> None:
    pooled = WorkerIdentity(job_id="synthetic", worker_id="worker-000", node_id="node-00",
                            pool="a100-pool", labels={"rack": "r7"})
    batches = [b.model_copy(update={"identity": pooled})
               for b in leak_on_long_episodes(IDENTITY, leak_bytes_per_s=1e6)]
    job = MetricsJob(TOPICS, {})
    result = job.process(_records(batches), _now_ms(batches))
    event = result.features[-1]
    assert event.tags["pool"] == "a100-pool" and event.tags["rack"] == "r7"
    assert event.tags["gpu_model"] == IDENTITY.gpu_model
    selector = TargetSelector(pools=["a100-pool"], gpu_models=[IDENTITY.gpu_model],
                              labels={"rack": "r7"})
    assert selector.matches(event.identity.job_id, event.tags)
    assert event.target_pool() == "a100-pool"
    job.save(result.states)
    _others_go_on(job, _now_ms(batches) + 60_000)
    lost = job.check_liveness(_now_ms(batches) + 60_000, lambda partition: len(batches))
    job.save(lost.overdue)
    lost = job.check_liveness(_now_ms(batches) + 62_000, lambda partition: len(batches))
    assert lost.outputs[0].event.tags == {"pool": "a100-pool", "rack": "r7",
                                          "gpu_model": IDENTITY.gpu_model}
    unpooled = leak_on_long_episodes(IDENTITY, leak_bytes_per_s=1e6)[:3]
    plain = MetricsJob(TOPICS, {}).process(_records(unpooled), _now_ms(unpooled))
    assert plain.features[-1].tags.keys() <= {"gpu_model", "episode_end_reason"}


def test_feature_events_name_the_gpu_they_came_from() -> None:
    from dataclasses import replace

    batches = leak_on_long_episodes(replace(IDENTITY, gpu_uuid="GPU-abc"), 1e6, phase_s=2,
                                    phases=1)
    result = MetricsJob(TOPICS, {}).process(_records(batches), _now_ms(batches))
    events = result.features
    assert {e.gpu_uuid for e in events} == {"GPU-abc"}
    assert {e.tags["gpu_model"] for e in events} == {IDENTITY.gpu_model}
