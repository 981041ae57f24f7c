"""Stream jobs on the real broker and chDB: known answers, a killed worker, two workers."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition
from helpers import partitions_held, start_stack, stop_stack, wait_for

from dsec.bench.traces import (
    TraceIdentity,
    grad_norm_decay,
    leak_on_long_episodes,
    reward_variance_jump,
)
from dsec.history import query
from dsec.infra.kafka_clients import consumer_config, make_producer
from dsec.infra.replay import replay
from dsec.infra.store.sink import wait_until_drained
from dsec.schemas import encode, topic_names
from dsec.schemas.frames import batch_frames
from dsec.schemas.settings import DsecSettings
from dsec.services.stack import SERVICES, sink_group, stream_group
from dsec.stream_jobs import worker_features
from dsec.stream_jobs.worker_state import WorkerState

pytestmark = pytest.mark.integration
START_MS = int(time.time() * 1000) - 3_600_000


def _settings(kafka_bootstrap: str, tmp_path) -> DsecSettings:
    return DsecSettings(bootstrap=kafka_bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}",
                        data_dir=tmp_path / "sink")


def _publish(settings: DsecSettings, batches) -> None:
    producer = make_producer(settings, "test-replay")
    counters = replay((encode(b) for b in batches), producer,
                      topic_names(settings.topic_prefix).metrics, speed=0)
    assert producer.flush(30) == 0 and counters.published == len(batches)


def lag_by_partition(config: dict, topic: str) -> dict[int, tuple[int, int]]:
    """partition → (committed offset, end offset) of a group, to say where it is stuck."""
    probe = Consumer({**config, "enable.auto.commit": False})
    try:
        count = len(probe.list_topics(topic, timeout=10).topics[topic].partitions)
        committed = probe.committed([TopicPartition(topic, p) for p in range(count)], 10)
        return {tp.partition: (tp.offset, probe.get_watermark_offsets(tp, timeout=10)[1])
                for tp in committed}
    finally:
        probe.close()


def _drained(settings: DsecSettings, services: frozenset[str] = frozenset(SERVICES)) -> None:
    topics = topic_names(settings.topic_prefix)
    stream = consumer_config(settings, stream_group(settings, services - {"sink"} or services))
    # A killed member holds its partitions until its session times out (60 s), then the
    # survivor or the restarted process recovers the tables before it reads on.
    assert wait_until_drained(stream, [topics.metrics], 300), lag_by_partition(
        stream, topics.metrics)
    sink = consumer_config(settings, sink_group(settings))
    assert wait_until_drained(sink, [topics.metrics, topics.features, topics.gpu_profiles], 300)


def _rows(settings: DsecSettings, sql: str) -> list:
    return query(settings, sql)["rows"]


def _final_features(settings: DsecSettings, worker: str,
                    by: tuple[str, ...] = ("episodes_total", "steps_total")) -> dict[str, float]:
    """The worker's last feature event (the one with the highest of the counters ``by``:
    by default, the one that saw the most episodes or steps)."""
    counters = ", ".join(f"'{name}'" for name in by)
    rows = _rows(settings, f"""
        SELECT feature, value FROM features WHERE event_id = (
            SELECT argMax(event_id, value) FROM features
            WHERE worker_id = '{worker}' AND feature IN ({counters}))""")
    return dict(rows)


def _expected_final(batches) -> dict[str, float]:
    state = WorkerState()
    last: dict[str, float] = {}
    for offset, batch in enumerate(batches):
        update = worker_features.update(state, batch_frames(batch), 0, offset, 0,
                                        worker_features.FeatureConfig())
        state, last = update.state, update.features
    return last


def test_known_answers_come_out_of_the_pipeline(kafka_bootstrap, tmp_path) -> None:
    settings = _settings(kafka_bootstrap, tmp_path)
    leak = 3_000_000.0
    leaky = TraceIdentity(worker_id="leaky", gpu_uuid="GPU-leaky", start_ms=START_MS)
    jumpy = TraceIdentity(worker_id="jumpy", gpu_uuid="GPU-jumpy", start_ms=START_MS)
    decaying = TraceIdentity(worker_id="decaying", gpu_uuid="GPU-decay", start_ms=START_MS)
    traces = {
        "leaky": leak_on_long_episodes(leaky, leak_bytes_per_s=leak, phase_s=20),
        "jumpy": reward_variance_jump(jumpy, jump_at_episode=200, episodes=400),
        "decaying": grad_norm_decay(decaying, log_slope_per_step=-0.003, steps=2000),
    }
    stack = start_stack(kafka_bootstrap, settings.data_dir, settings.topic_prefix)
    try:
        _publish(settings, [b for trace in traces.values() for b in trace])
        _drained(settings)
        rates = dict(wait_for(lambda: _rows(settings, """
            SELECT regime, sum(delta_bytes) / sum(delta_s) FROM gpu_profiles FINAL
            WHERE gpu_uuid = 'GPU-leaky' GROUP BY regime"""), 30, what="the GPU profile"))
        assert rates["long"] == pytest.approx(leak, rel=0.02)
        assert rates["short"] == pytest.approx(0.0, abs=1.0)
        first_jump = _rows(settings, """
            SELECT min(e.value) FROM features AS j INNER JOIN features AS e USING (event_id)
            WHERE j.worker_id = 'jumpy' AND j.feature = 'reward_variance_jump_ratio'
              AND j.value > 4 AND e.feature = 'episodes_total'""")[0][0]
        assert 200 < first_jump <= 220  # within one reward window of the jump
        slope = _final_features(settings, "decaying")["grad_norm_log_slope"]
        assert slope == pytest.approx(-0.003, rel=1e-6)
        stored = _rows(settings, "SELECT worker_id, count() FROM raw_episode GROUP BY worker_id")
        assert dict(stored) == {"leaky": 80 * 20, "jumpy": 400}
    finally:
        stop_stack(stack)


def test_killed_stream_worker_resumes_without_losing_or_doubling(kafka_bootstrap,
                                                                  tmp_path) -> None:
    settings = _settings(kafka_bootstrap, tmp_path)
    workers = [TraceIdentity(worker_id=f"w{i}", gpu_uuid=f"GPU-{i}", start_ms=START_MS)
               for i in range(3)]
    traces = {w.worker_id: reward_variance_jump(w, jump_at_episode=300, episodes=600, seed=i)
              for i, w in enumerate(workers)}
    batches = [b for trace in zip(*traces.values(), strict=True) for b in trace]
    half = len(batches) // 2
    stack = start_stack(kafka_bootstrap, settings.data_dir, settings.topic_prefix)
    try:
        _publish(settings, batches[:half])
        wait_for(lambda: _rows(settings, "SELECT count() FROM features")[0][0] > 0, 60,
                 what="the first features")
        rest = threading.Thread(target=_publish, args=(settings, batches[half:]))
        rest.start()
        time.sleep(0.3)
        stop_stack(stack, kill=True)  # mid-stream, no goodbye
        rest.join()
        stack = start_stack(kafka_bootstrap, settings.data_dir, settings.topic_prefix)
        _drained(settings)
        episodes = dict(_rows(settings, "SELECT worker_id, count() FROM raw_episode "
                                        "GROUP BY worker_id"))
        assert episodes == {w.worker_id: 600 for w in workers}
        doubled = _rows(settings, "SELECT count() FROM (SELECT event_id, feature, count() AS n "
                                  "FROM features GROUP BY event_id, feature HAVING n > 1)")
        assert doubled == [[0]]
        for worker, trace in traces.items():
            expected = _expected_final(trace)
            got = wait_for(lambda w=worker: _final_features(settings, w), 30,
                           what=f"final features of {worker}")
            assert got["episodes_total"] == 600
            for name in ("reward_mean", "reward_variance", "reward_variance_jump_ratio"):
                assert got[name] == pytest.approx(expected[name], rel=1e-9), (worker, name)
    finally:
        stop_stack(stack)


def test_two_stream_job_processes_share_the_partitions(kafka_bootstrap, tmp_path) -> None:
    settings = _settings(kafka_bootstrap, tmp_path)
    workers = [TraceIdentity(worker_id=f"worker-{i:02d}", gpu_uuid=f"GPU-{i}",
                             start_ms=START_MS) for i in range(8)]
    traces = {w.worker_id: reward_variance_jump(w, jump_at_episode=100, episodes=200, seed=i)
              for i, w in enumerate(workers)}
    sink = start_stack(kafka_bootstrap, settings.data_dir, settings.topic_prefix,
                       services="sink")
    jobs = [start_stack(kafka_bootstrap, tmp_path / f"job{i}", settings.topic_prefix,
                        services="stream-jobs") for i in range(2)]
    try:
        group = stream_group(settings, frozenset({"stream-jobs"}))
        wait_for(lambda: len(partitions_held(kafka_bootstrap, group)) == 2, 60,
                 what="both stream workers to hold partitions")
        _publish(settings, [b for trace in traces.values() for b in trace])
        _drained(settings, frozenset({"stream-jobs"}))
        for worker, trace in traces.items():
            expected = _expected_final(trace)
            got = wait_for(lambda w=worker: _final_features(settings, w), 30,
                           what=f"final features of {worker}")
            for name in ("episodes_total", "reward_mean", "reward_variance"):
                assert got[name] == pytest.approx(expected[name], rel=1e-9), (worker, name)
    finally:
        for process in [*jobs, sink]:
            stop_stack(process)
