"""``dsec bench detection``: labelled faults in neutral telemetry, replayed in real time
through the whole stack, and the stored decisions scored against the labels.

Every part runs as in production, in processes of its own: a Kafka broker (the project's
own KRaft broker, unless ``--bootstrap``), the stream jobs and the policy engine with the
built-in pack (``dsec up --services stream-jobs,policy-engine,sink``, the ClickHouse sink
beside them). Each (shape, seed) is a fleet of simulated workers of its own job
(``detection_traces``); all run at once.

1. A healthy history (``preroll_s``, in 10 s messages) is published at once, so that the
   workers' windows hold their own past when the faults begin; the run waits until the
   stream jobs and the policy engine have read it.
2. The traces are replayed in real time (``infra.replay``), one message per worker every
   ``interval_s``, made as they are published; the faults begin after the start.
3. Once the stack has caught up, the decisions and commands stored in ClickHouse for the
   run's jobs are read back and scored (``detection_score``); only those of the real-time
   part count (the history's are reported apart).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from dsec.bench.detection_score import Firing, score
from dsec.bench.detection_traces import DetectionTrace, TraceSpec
from dsec.bench.detection_workloads import (
    FAULT_CLASSES,
    HELD_OUT_SEEDS,
    HELD_OUT_SHAPES,
    SHAPES,
    TUNING_SEEDS,
    TUNING_SHAPES,
)
from dsec.bench.reaction import ReactionBenchError, _spawn, _wait_until
from dsec.history import query
from dsec.infra.kafka_clients import consumer_config, make_producer
from dsec.infra.kafka_local import LocalKafka
from dsec.infra.keys import signing_env
from dsec.infra.replay import replay
from dsec.infra.store.sink import wait_until_drained
from dsec.infra.topics import ensure_topics
from dsec.schemas import now_ms, topic_names
from dsec.schemas.settings import DsecSettings
from dsec.services.stack import read_stack_state, sink_group, stop_process, stream_group

__all__ = ["DetectionBenchError", "DetectionBenchOptions", "run_detection_bench"]

SERVICES = frozenset({"stream-jobs", "policy-engine", "sink"})


class DetectionBenchError(ReactionBenchError):
    """The stack did not start or did not keep up; the logs are kept."""


@dataclass(frozen=True)
class DetectionBenchOptions:
    shapes: tuple[str, ...] = HELD_OUT_SHAPES
    seeds: tuple[int, ...] = HELD_OUT_SEEDS
    workers: int = 16
    duration_s: float = 240.0
    preroll_s: float = 600.0
    interval_s: float = 1.0
    faults: tuple[str, ...] = FAULT_CLASSES  # () for a quiet run
    start_timeout_s: float = 180.0
    drain_timeout_s: float = 300.0
    bootstrap: str | None = None

    def specs(self) -> list[TraceSpec]:
        unknown = sorted(set(self.shapes) - SHAPES.keys())
        if unknown:
            raise ValueError(f"no workload shapes {', '.join(unknown)}; "
                             f"there are {', '.join(SHAPES)}")
        high_s = min(120.0, self.duration_s / 2)
        return [TraceSpec(shape, seed, self.workers, self.duration_s, self.faults,
                          (min(30.0, high_s / 2), high_s))
                for shape in self.shapes for seed in self.seeds]


def _environment(settings: DsecSettings) -> dict[str, str]:
    return {**os.environ, **signing_env(settings), "DSEC_BOOTSTRAP": settings.bootstrap,
            "DSEC_TOPIC_PREFIX": settings.topic_prefix, "DSEC_DATA_DIR": str(settings.data_dir),
            "DSEC_POLICY_DRY_RUN": "0", "DSEC_METRICS_PORT": "0", "PYTHONUNBUFFERED": "1"}


def _lines(traces: Sequence[DetectionTrace], a_ms: int, b_ms: int, interval_ms: int,
           heartbeat_first: bool) -> Iterator[bytes]:
    """Every trace's messages for [a_ms, b_ms), tick by tick, made as they are asked for."""
    for tick in range(a_ms, b_ms, interval_ms):
        end = min(tick + interval_ms, b_ms)
        for trace in traces:
            for document in trace.documents(tick, end, interval_ms,
                                            heartbeat_first and tick == a_ms):
                yield orjson.dumps(document)


def _drain(settings: DsecSettings, timeout_s: float, work: Path) -> None:
    topics = topic_names(settings.topic_prefix)
    stream = consumer_config(settings, stream_group(settings, SERVICES))
    sink = consumer_config(settings, sink_group(settings))
    if not wait_until_drained(stream, [topics.metrics, topics.gpu_cards, topics.features],
                              timeout_s):
        raise DetectionBenchError("the stream jobs did not catch up", work)
    if not wait_until_drained(sink, [topics.features, topics.actuations, topics.decisions],
                              timeout_s):
        raise DetectionBenchError("the sink did not catch up", work)


def _stored(settings: DsecSettings, jobs: Sequence[str], since_ms: int,
            until_ms: int) -> tuple[list[Firing], list[Firing], list[Firing], int]:
    """(firings, commands) of the real-time part, the firings of the history before, and
    the most suppressed-decision records of any one worker."""
    names = ", ".join(f"'{job}'" for job in jobs)
    decisions = query(settings, f"""
        SELECT toUnixTimestamp64Milli(event_time), policy_name, job_id, worker_id, detail
        FROM policy_decisions WHERE decision = 'fired' AND job_id IN ({names})""")["rows"]
    commands = query(settings, f"""
        SELECT toUnixTimestamp64Milli(event_time), policy_name, job_id, worker_id
        FROM actuations WHERE job_id IN ({names})""")["rows"]
    fired = [Firing(int(t), p, j, w, d) for t, p, j, w, d in decisions]
    suppressed = query(settings, f"""
        SELECT max(records) FROM (SELECT count() AS records FROM policy_decisions
        WHERE decision LIKE 'suppressed%' AND job_id IN ({names}) GROUP BY job_id, worker_id)
        """)["rows"]
    sent = [Firing(int(t), p, j, w) for t, p, j, w in commands]
    within = [f for f in fired if since_ms <= f.time_ms <= until_ms]
    before = [f for f in fired if f.time_ms < since_ms]
    return (within, [c for c in sent if since_ms <= c.time_ms <= until_ms], before,
            int(suppressed[0][0] or 0) if suppressed else 0)


def run_detection_bench(options: DetectionBenchOptions) -> dict:
    specs = options.specs()
    work = Path(tempfile.mkdtemp(prefix="dsec-bench-detection-"))
    kafka = None if options.bootstrap else LocalKafka(data_dir=work / "kafka")
    stack = None
    started_s = time.monotonic()
    try:
        bootstrap = options.bootstrap or kafka.start()  # type: ignore[union-attr]
        settings = DsecSettings(bootstrap=bootstrap,
                                topic_prefix=f"detect{uuid.uuid4().hex[:8]}",
                                data_dir=work / "data",
                                metrics_port=0)
        settings.data_dir.mkdir()
        ensure_topics(settings)
        stack = _spawn(["dsec.cli", "up", "--bootstrap", bootstrap, "--services",
                        ",".join(sorted(SERVICES)), "--data-dir", str(settings.data_dir)],
                       _environment(settings), work / "stack.log")
        _wait_until(lambda: read_stack_state(settings.data_dir) is not None, stack,
                    options.start_timeout_s, "the stack", work)
        history_from_ms = now_ms() - int(options.preroll_s * 1000)
        traces = [DetectionTrace(spec, history_from_ms) for spec in specs]
        producer = make_producer(settings, "dsec-bench-detection")
        metrics_topic = topic_names(settings.topic_prefix).metrics
        replay(_lines(traces, history_from_ms, now_ms(), 10_000, False), producer,
               metrics_topic, speed=0)
        producer.flush(60)
        _drain(settings, options.drain_timeout_s, work)
        interval_ms = int(options.interval_s * 1000)
        # Started one interval back: each message is published as its time comes, not
        # an interval ahead of it.
        start_ms = now_ms() - interval_ms
        labels = {trace.spec.job_id: trace.start(start_ms) for trace in traces}
        end_ms = max(trace.end_ms for trace in traces)
        counters = replay(_lines(traces, start_ms, end_ms, interval_ms, True), producer,
                          metrics_topic, speed=1.0)
        producer.flush(60)
        lag_at_end_s = (now_ms() - end_ms) / 1000.0
        del producer  # closed before the broker stops
        _drain(settings, options.drain_timeout_s, work)
        firings, commands, history, suppressed_max = _stored(settings, list(labels), start_ms,
                                                             end_ms)
    finally:
        if stack is not None:
            stop_process(stack)
        if kafka is not None:
            kafka.stop()
    shutil.rmtree(work, ignore_errors=True)  # kept above for its logs when the bench failed
    scored = score(labels, firings, commands)
    return {
        **scored,
        "history_firings": len([f for f in history if f.policy != "periodic-snapshot"]),
        "suppressed_records_per_worker_max": suppressed_max,
        "traces": [{"job_id": t.spec.job_id, "shape": t.spec.shape, "seed": t.spec.seed,
                    "held_out": t.spec.shape not in TUNING_SHAPES
                    and t.spec.seed not in TUNING_SEEDS,
                    "labels": [label.to_json() for label in t.labels]} for t in traces],
        "tuned_on": {"shapes": list(TUNING_SHAPES), "seeds": list(TUNING_SEEDS)},
        "workers_per_trace": options.workers, "duration_s": options.duration_s,
        "preroll_s": options.preroll_s, "interval_s": options.interval_s,
        "messages_published": counters.published,
        "replay_behind_s_at_end": round(lag_at_end_s, 2),
        "wall_s": round(time.monotonic() - started_s, 1), "cpu_count": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
