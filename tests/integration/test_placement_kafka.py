"""Placement on the real broker and chDB, from replayed traces: the metrics job's features
and GPU profiles of a card that leaks on long episodes and of a stable one, feature
traces of a workload that OOMs on one model, and GPU-health changes go through the
personality service and the sink; the recommendation read from the store ranks the
stable card first for long episodes, steers the workload off the model it OOMed on, and
filters a degraded GPU until it has been healthy for the hold time."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import replace

import pytest
from helpers import wait_for

from dsec.bench.traces import TraceIdentity, leak_on_long_episodes
from dsec.infra.kafka_clients import consumer_config, make_producer, producer_config
from dsec.infra.observability import ProcessMetrics
from dsec.infra.records import Record
from dsec.infra.store.clickhouse import connect, ensure_schema
from dsec.infra.store.query_server import run_readonly
from dsec.infra.store.sink import ClickHouseSink
from dsec.infra.topics import ensure_topics
from dsec.placement.history import read_history
from dsec.placement.ranking import PlacementConfig, recommend
from dsec.schemas import FeatureEvent, WorkerIdentity, encode, now_ms, topic_names
from dsec.schemas.alerts import GpuHealthEvent
from dsec.schemas.metrics import encode_packed
from dsec.schemas.placement import RecommendRequest
from dsec.services.personality import PersonalityService
from dsec.stream_jobs.metrics_job import MetricsJob

pytestmark = pytest.mark.integration
MIB = 1 << 20


def _metrics_job_outputs(topics, traces) -> list:
    """The metrics job's outputs for the traces, each stamped at its batch's time (as the
    job stamps them live), so the replay covers the trace's time and not a moment."""
    trace_ms = [0]
    job = MetricsJob(topics, {}, clock_ms=lambda: trace_ms[0])
    outputs = []
    for offset, batch in enumerate(traces):
        trace_ms[0] = batch.columns.heartbeat.event_time_ms[0]
        result = job.process([Record(topics.metrics, 0, offset,
                                     batch.identity.worker_id.encode(),
                                     encode_packed(batch))], trace_ms[0])
        outputs.extend(result.outputs)
        job.save(result.states)
    return outputs


def _oom_trace(worker: str, gpu: str, model: str, start_ms: int, oom_at: set[int]):
    identity = WorkerIdentity(job_id="placement-job", worker_id=worker, node_id=f"node-{gpu}",
                              pool="oom", labels={"workload": "ppo"})
    ooms = 0
    for i in range(60):
        ooms += i in oom_at
        yield FeatureEvent(identity=identity, gpu_uuid=gpu, event_time_ms=start_ms + i * 5000,
                           tags={"gpu_model": model, "pool": "oom"},
                           features={"gpu_oom_total": float(ooms), "worker_lost": 0.0,
                                     "episode_length_mean": 200.0})


def test_personalities_affinity_and_health_steer_placement(settings, tmp_path) -> None:
    topics = topic_names(settings.topic_prefix)
    ensure_topics(settings, partitions=1)
    client, lock = connect(f"chdb://{tmp_path / 'store'}"), threading.Lock()
    ensure_schema(client)
    metrics = ProcessMetrics()
    sink = ClickHouseSink(client, lock, consumer_config(settings, f"sink-{uuid.uuid4().hex[:6]}"),
                          topics, producer_config(settings, "test-sink"), metrics=metrics)
    service = PersonalityService(settings, metrics)
    start_ms = now_ms() - 600_000
    base = TraceIdentity(job_id="placement-job", start_ms=start_ms, gpu_model="SimGPU-A")
    traces = [
        batch.model_copy(update={"identity": batch.identity.model_copy(update={"pool": "leak"})})
        for batch in (
            *leak_on_long_episodes(replace(base, worker_id="leaky", node_id="node-leaky",
                                           gpu_uuid="GPU-leaky"), leak_bytes_per_s=8 * MIB),
            *leak_on_long_episodes(replace(base, worker_id="stable", node_id="node-stable",
                                           gpu_uuid="GPU-stable"), leak_bytes_per_s=0.0))]
    producer = make_producer(settings, "test-replay")
    for output in _metrics_job_outputs(topics, traces):
        producer.produce(output.topic, key=output.key, value=output.value())
    for event in [*_oom_trace("p-x", "GPU-x", "SimGPU-X", start_ms, {20, 40}),
                  *_oom_trace("p-y", "GPU-y", "SimGPU-Y", start_ms, set())]:
        producer.produce(topics.features, key=event.identity.worker_id.encode(),
                         value=encode(event))
    assert producer.flush(30) == 0

    def query(sql: str) -> dict:
        return run_readonly(client, lock, sql)

    def ask(request: RecommendRequest, config: PlacementConfig):
        return recommend(read_history(query), request, now_ms(), config)

    sink.start()
    service.start()
    try:
        def stored() -> bool:
            history = read_history(query)
            leaky = history.gpus.get("GPU-leaky")
            ppo_x = history.affinity.get(("ppo", "SimGPU-X"))
            return (leaky is not None and leaky.regimes.get("long", {}).get(
                        "leak_bytes_per_s", 0) > 0 and leaky.regimes["all"]["observed_s"] > 100
                    and ppo_x is not None and ppo_x.ooms == 2
                    and ("ppo", "SimGPU-Y") in history.affinity)

        wait_for(stored, 120, what="personalities and affinity stored")
        # Long enough to see the hold through the sink on a loaded machine.
        config = PlacementConfig(hold_s=15.0)

        long = ask(RecommendRequest(workload="rollout", pool="leak", regime="long"), config)
        assert [g.gpu_uuid for g in long.ranked] == ["GPU-stable", "GPU-leaky"], long
        leaky = long.ranked[1]
        assert leaky.reasons[0].key == "gpu:GPU-leaky/long"
        assert leaky.score < 0.5 * long.ranked[0].score
        leak_shown = float(leaky.reasons[0].detail.split("leak ")[1].split(" B/s")[0])
        assert leak_shown == pytest.approx(8 * MIB, rel=0.05)

        ppo = ask(RecommendRequest(workload="ppo", pool="oom"), config)
        assert ppo.chosen == ["GPU-y"]
        x = next(g for g in ppo.ranked if g.gpu_uuid == "GPU-x")
        assert any(r.source == "workload_affinity" and r.key == "ppo/SimGPU-X"
                   and r.detail.startswith("2 OOMs") for r in x.reasons), x.reasons

        def publish_health(state: str, since_ms: int) -> None:
            event = GpuHealthEvent(gpu_uuid="GPU-stable", gpu_model="SimGPU-A", state=state,
                                   since_ms=since_ms, signal="thermal_throttle",
                                   reason="throttled 14 of 20 samples",
                                   policy_name="gpu-thermal")
            producer.produce(topics.gpu_health, key=b"GPU-stable", value=encode(event))
            assert producer.flush(30) == 0

        request = RecommendRequest(workload="rollout", pool="leak", regime="long")

        def stable_filtered(word: str):
            answer = ask(request, config)
            why = next((f.why for f in answer.filtered if f.gpu_uuid == "GPU-stable"), "")
            return answer if word in why else None

        publish_health("degraded", now_ms())
        degraded = wait_for(lambda: stable_filtered("degraded since"), 60,
                            what="the degraded GPU filtered")
        assert degraded.chosen == ["GPU-leaky"]
        healthy_at_ms = now_ms()
        publish_health("healthy", healthy_at_ms)
        held = wait_for(lambda: stable_filtered("hold"), 60, what="the GPU held")
        assert held.chosen == ["GPU-leaky"]
        time.sleep(max(0.0, healthy_at_ms / 1000 + config.hold_s - time.time()) + 0.1)
        back = ask(request, config)
        assert "GPU-stable" not in {f.gpu_uuid for f in back.filtered}
        assert back.chosen == ["GPU-stable"]
    finally:
        service.stop()
        sink.stop()
        client.close()  # chDB holds one store per process: let the next test open its own
