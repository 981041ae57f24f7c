"""Fleet features on the real broker and chDB: replayed probe traces of two pools and breaker
trips made by the real policy engine, with known answers per pool and for the whole job."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest
from feature_values import HEALTHY
from helpers import start_stack, stop_stack, wait_for

from dsec.bench.traces import TraceIdentity, slow_grad_sync
from dsec.history import query
from dsec.infra.kafka_clients import make_producer
from dsec.infra.replay import replay
from dsec.schemas import FeatureEvent, WorkerIdentity, encode, now_ms, topic_names
from dsec.schemas.metrics import encode_packed
from dsec.schemas.settings import DsecSettings

pytestmark = pytest.mark.integration
JOB = "fleet-job"


def _pooled(batches, pool: str):
    return [b.model_copy(update={"identity": b.identity.model_copy(update={"pool": pool})})
            for b in batches]


def _fleet(settings: DsecSettings, worker_id: str) -> dict[str, float]:
    """The last fleet feature event of a scope, as stored."""
    rows = query(settings, f"""
        SELECT feature, value FROM features WHERE event_id = (
            SELECT argMax(event_id, event_time) FROM features
            WHERE job_id = '{JOB}' AND worker_id = '{worker_id}')""")["rows"]
    return dict(rows)


def test_pool_and_job_features_from_replayed_traces(kafka_bootstrap, tmp_path) -> None:
    settings = DsecSettings(bootstrap=kafka_bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}",
                            data_dir=tmp_path / "stack")
    topics = topic_names(settings.topic_prefix)
    start_ms = now_ms() - 120_000
    ident = TraceIdentity(job_id=JOB, start_ms=start_ms)
    traces = [
        *_pooled(slow_grad_sync(replace(ident, worker_id="a0", gpu_uuid="GPU-a0"), seconds=10,
                                latency_ms=20.0, failed_every=5, recovery_time_s=6.0,
                                utilisation_pct=90.0), "A"),
        *_pooled(slow_grad_sync(replace(ident, worker_id="a1", gpu_uuid="GPU-a1"), seconds=10,
                                latency_ms=20.0, failed_every=10, recovery_time_s=10.0,
                                utilisation_pct=30.0), "A"),
        *_pooled(slow_grad_sync(replace(ident, worker_id="b0", gpu_uuid="GPU-b0"), seconds=10,
                                latency_ms=20.0, utilisation_pct=50.0), "B"),
    ]
    # Four workers of pool A over the breaker's latency cap for 30 s: four trips there.
    tripping = [
        FeatureEvent(identity=WorkerIdentity(job_id=JOB, worker_id=f"hot{i}", node_id="n1",
                                             pool="A"),
                     event_time_ms=now_ms() - 60_000 + t * 1000, tags={"pool": "A"},
                     features={**HEALTHY, "grad_sync_latency_p95_ms": 150.0})
        for i in range(4) for t in range(0, 30, 5)]
    stack = start_stack(kafka_bootstrap, settings.data_dir, settings.topic_prefix,
                        env={"DSEC_FLEET_PUBLISH_INTERVAL_S": "1"})
    try:
        producer = make_producer(settings, "test-replay")
        counters = replay((encode_packed(b) for b in traces), producer, topics.metrics, speed=0)
        for event in tripping:
            producer.produce(topics.features, key=event.identity.worker_id.encode(),
                             value=encode(event))
        assert producer.flush(30) == 0 and counters.published == len(traces)

        def settled() -> dict | None:
            pool_a, pool_b, job = (_fleet(settings, w) for w in ("pool:A", "pool:B", "job"))
            done = (pool_a.get("breaker_trips_per_hour") == 4
                    and "snapshot_recovery_time_s" in pool_a
                    and pool_a.get("fleet_grad_sync_success_rate") == pytest.approx(0.85)
                    and job.get("fleet_grad_sync_success_rate") == pytest.approx(1 - 30 / 300)
                    and "pool_utilisation_rate" in pool_b
                    # each worker's resume, then its loss once its heartbeats stopped
                    and pool_a.get("interruptions_per_hour") == 4
                    and pool_b.get("interruptions_per_hour") == 1)
            return {"A": pool_a, "B": pool_b, "job": job} if done else None

        fleet = wait_for(settled, 180, interval_s=1, what="the fleet features to settle")
        pool_a, pool_b, job = fleet["A"], fleet["B"], fleet["job"]
        assert pool_a["pool_utilisation_rate"] == pytest.approx(0.6)
        assert pool_a["snapshot_recovery_time_s"] == pytest.approx(8.0)
        assert pool_b["pool_utilisation_rate"] == pytest.approx(0.5)
        assert pool_b["fleet_grad_sync_success_rate"] == 1.0
        assert pool_b["breaker_trips_per_hour"] == 0
        assert job["pool_utilisation_rate"] == pytest.approx((0.9 + 0.3 + 0.5) / 3)
        assert job["breaker_trips_per_hour"] == 4
        stored = query(settings, f"""
            SELECT DISTINCT worker_id, node_id, window FROM features
            WHERE job_id = '{JOB}' AND node_id = 'fleet' ORDER BY worker_id""")["rows"]
        assert stored == [["job", "fleet", "1h"], ["pool:A", "fleet", "1h"],
                          ["pool:B", "fleet", "1h"]]
    finally:
        stop_stack(stack)
