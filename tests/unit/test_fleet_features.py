"""Fleet features as pure functions and as stages, on inputs with known answers (no broker)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dsec.bench.traces import TraceIdentity, slow_grad_sync
from dsec.infra.records import Record
from dsec.schemas import PolicyDecision, WorkerIdentity, encode, topic_names
from dsec.schemas.fleet import FleetInput, scope_key
from dsec.schemas.policies import DecisionKind
from dsec.stream_jobs.fleet_features import (
    FleetConfig,
    FleetState,
    add_input,
    fleet_features,
    forget_departed,
    window_name,
)
from dsec.stream_jobs.fleet_job import FleetJob, FleetRouter, scope_of
from dsec.stream_jobs.metrics_job import MetricsJob

TOPICS = topic_names("t")
CONFIG = FleetConfig(window_s=3600.0)
T0 = 1_700_000_000_000


def _worker(name: str, pool: str | None = "A") -> WorkerIdentity:
    return WorkerIdentity(job_id="job", worker_id=name, node_id="n0", pool=pool)


def _input(worker: str, t_s: float, n: int = 0, trip: bool = False, **readings: float):
    return FleetInput(event_id=f"{worker}-{t_s}-{n}-{trip}".ljust(8, "x"),
                      event_time_ms=T0 + int(t_s * 1000), scope="pool", job_id="job",
                      pool="A", worker=_worker(worker), readings=readings, breaker_trip=trip)


def _run(inputs, config: FleetConfig = CONFIG) -> FleetState:
    state = FleetState()
    for item in inputs:
        state = add_input(state, item, config)
    return state


def test_utilisation_sync_rate_and_snapshot_recovery_over_the_window() -> None:
    state = _run([
        _input("w0", 1, gpu_utilisation_pct=90.0, grad_syncs_total=100,
               grad_syncs_failed_total=0, recoveries_total=1, snapshot_recoveries_total=1,
               snapshot_recovery_time_s_total=6.5),
        _input("w1", 2, gpu_utilisation_pct=30.0, grad_syncs_total=100,
               grad_syncs_failed_total=4, recoveries_total=1, snapshot_recoveries_total=1,
               snapshot_recovery_time_s_total=9.5),
        _input("w0", 60, gpu_utilisation_pct=60.0, grad_syncs_total=300,
               grad_syncs_failed_total=0),
    ])
    features = fleet_features(state, T0 + 120_000, CONFIG)
    assert features["pool_utilisation_rate"] == pytest.approx(0.6)
    assert features["fleet_grad_sync_success_rate"] == pytest.approx(1 - 4 / 400)
    assert features["snapshot_recovery_time_s"] == pytest.approx(8.0)
    # a resume with no loss before it is an interruption of its own (a fast restart)
    assert features["interruptions_per_hour"] == 2
    assert features["breaker_trips_per_hour"] == 0
    assert "effective_training_time_ratio" not in features  # no step timing


def test_a_loss_and_the_resume_that_ends_it_are_one_interruption() -> None:
    state = _run([
        _input("w0", 1, worker_lost=0.0),
        _input("w0", 30, worker_lost=1.0),
        _input("w0", 31, worker_lost=1.0),  # still lost: nothing new
        _input("w0", 90, worker_lost=0.0, recoveries_total=1),
        _input("w1", 100, worker_lost=1.0),
    ])
    assert fleet_features(state, T0 + 200_000, CONFIG)["interruptions_per_hour"] == 2


def test_breaker_trips_leave_the_window_after_an_hour() -> None:
    trips = [_input("w0", t, n=t, trip=True) for t in (0, 600, 1200, 1800)]
    state = _run(trips)
    assert fleet_features(state, T0 + 1_900_000, CONFIG)["breaker_trips_per_hour"] == 4
    # an hour after the first trip (and a bucket, its resolution) it no longer counts
    later = T0 + 3_600_000 + CONFIG.bucket_ms
    assert fleet_features(state, later, CONFIG)["breaker_trips_per_hour"] == 3


def test_effective_training_time_is_productive_step_time_over_wall_time() -> None:
    # Two workers from t=0; w0 steps the whole time, w1 half of it, then is lost.
    state = _run([
        _input("w0", 0, step_time_s_total=0.0),
        _input("w1", 0, step_time_s_total=0.0),
        _input("w0", 100, step_time_s_total=100.0),
        _input("w1", 50, step_time_s_total=50.0),
        _input("w1", 60, worker_lost=1.0),
    ])
    features = fleet_features(state, T0 + 100_000, CONFIG)
    assert features["effective_training_time_ratio"] == pytest.approx(150 / 200)


def test_a_replayed_input_counts_once_and_an_old_total_adds_nothing() -> None:
    first = _input("w0", 1, grad_syncs_total=10, grad_syncs_failed_total=5)
    later = _input("w0", 2, grad_syncs_total=20, grad_syncs_failed_total=5)
    stale = first.model_copy(update={"event_id": "another-id-for-the-old-total"})
    state = _run([first, first, later, stale])
    assert fleet_features(state, T0 + 5_000, CONFIG)["fleet_grad_sync_success_rate"] == 0.75


def test_departed_workers_and_old_buckets_are_forgotten() -> None:
    state = _run([_input("w0", 0, gpu_utilisation_pct=50.0), _input("w1", 3000)])
    kept = forget_departed(state, T0 + 3_700_000, CONFIG)
    assert set(kept.workers) == {"w1"}
    assert all(b.start_ms > T0 for b in kept.buckets)
    assert FleetState.from_bytes(kept.to_bytes()) == kept


def test_window_names() -> None:
    assert [window_name(s) for s in (3600, 7200, 900, 90, 1.5)] == ["1h", "2h", "15m", "90s",
                                                                     "1.5s"]


def test_scope_keys_name_the_pool_or_the_whole_job() -> None:
    assert scope_of(scope_key("job-1", "A")) == ("pool", "job-1", "A")
    assert scope_of(scope_key("job-1", None)) == ("job", "job-1", None)


# ---- the stages, from probe batches through the metrics job ----------------------------

def _records(topic: str, outputs) -> list[Record]:
    return [Record(topic, 0, offset, output.key, output.value())
            for offset, output in enumerate(outputs)]


def _breaker_trip(worker: WorkerIdentity, at_ms: int, n: int) -> PolicyDecision:
    return PolicyDecision(event_id=f"trip-{worker.worker_id}-{n}", event_time_ms=at_ms,
                          policy_name="bandwidth-latency-breaker", policy_version=1,
                          identity=worker, decision=DecisionKind.FIRED, stage=1)


def test_pool_features_from_probe_batches_and_decisions() -> None:
    start_ms = T0 - 60_000
    pool_a = [replace(TraceIdentity(worker_id=f"a{i}", start_ms=start_ms), job_id="job")
              for i in range(2)]
    traces = [
        slow_grad_sync(pool_a[0], seconds=10, latency_ms=20.0, failed_every=5,
                       recovery_time_s=6.0, utilisation_pct=90.0),
        slow_grad_sync(pool_a[1], seconds=10, latency_ms=20.0, failed_every=10,
                       recovery_time_s=10.0, utilisation_pct=30.0),
    ]
    clock = [T0]
    metrics = MetricsJob(TOPICS, {}, clock_ms=lambda: clock[0])
    batches = [replace_pool(b, "A") for trace in traces for b in trace]
    result = metrics.process(
        [Record(TOPICS.metrics, 0, i, b.identity.worker_id.encode(), encode(b))
         for i, b in enumerate(batches)], T0)
    router = FleetRouter(TOPICS)
    trips = [_breaker_trip(batches[0].identity, T0 + n, n) for n in range(4)]
    inputs = router.process([*_records(TOPICS.features, result.feature_columns),
                             *_records(TOPICS.decisions, [_as_output(t) for t in trips])])
    assert {o.key for o in inputs} == {b"job|pool:A", b"job|job"}
    states: dict[str, FleetState] = {}
    job = FleetJob(TOPICS, states, CONFIG, clock_ms=lambda: T0 + 1_000)
    job.save(job.process(_records(TOPICS.fleet_inputs, inputs)))
    tick = job.tick()
    by_scope = {e.identity.worker_id: e for e in tick.events}
    pool = by_scope["pool:A"]
    assert (pool.scope, pool.identity.pool, pool.window, pool.tags) == (
        "pool", "A", "1h", {"pool": "A"})
    features = pool.features
    assert features["pool_utilisation_rate"] == pytest.approx(0.6)
    assert features["fleet_grad_sync_success_rate"] == pytest.approx(1 - (20 + 10) / 200)
    assert features["snapshot_recovery_time_s"] == pytest.approx(8.0)
    assert features["breaker_trips_per_hour"] == 4
    assert features["interruptions_per_hour"] == 2  # two resumes, no loss before them
    assert by_scope["job"].features == features  # the job has one pool
    assert tick.outputs[0].topic == TOPICS.features


def _as_output(decision: PolicyDecision):
    from dsec.infra.records import Output

    return Output(TOPICS.decisions, decision.policy_name.encode(), decision)


def replace_pool(batch, pool: str):
    identity = batch.identity.model_copy(update={"pool": pool})
    return batch.model_copy(update={"identity": identity})


def test_undecodable_records_are_counted_and_skipped() -> None:
    router = FleetRouter(TOPICS)
    assert router.process([Record(TOPICS.features, 0, 0, b"k", b"{not json")]) == []
    assert router.counters.undecodable == 1
