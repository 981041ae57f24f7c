"""``dsec bench faults``: a three-node Kafka cluster under steady probe load, with the
leader of the metrics partitions, then the active controller, then the stream-job process
killed (SIGKILL) and each restarted.

Everything runs as in production, each part in its own process: three KRaft nodes
(broker and controller each, topics replicated three times, ``min.insync.replicas`` 2),
the sink into chDB, the stream jobs and the policy engine (``dsec up --services ...``),
and light synthetic workers (``dsec.bench.live_load``) whose producer is the probe's:
idempotent, ``acks=all``, a batch retried for five minutes.

Samples sent are those the brokers acknowledged; stored, lost and doubled are read from
the store once the sink has read everything. A fault's ``recovery_s`` runs from the kill
until the store holds, and the stream jobs have turned into features, as many batches as had
been published when the killed part was back in service (at the kill for a broker, whose
partitions move to the others; at its restart for the stream-job process) and one more
flush of every worker: the pipeline has caught up through the new leaders or the new
process and runs at full rate again.
``baseline_catch_up_s`` is the same measure with nothing killed (the pipeline's own delay).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dsec.bench.live_load import LiveLoad, LoadProfile, worker_identities
from dsec.bench.service_processes import ServiceProcess
from dsec.history import HistoryError, query
from dsec.infra.kafka_clients import consumer_config
from dsec.infra.kafka_cluster import LocalKafkaCluster
from dsec.infra.keys import signing_env
from dsec.infra.store.raw_columns import raw_table_name
from dsec.infra.store.sink import wait_until_drained
from dsec.infra.topics import ensure_topics, min_insync_replicas
from dsec.schemas import topic_names
from dsec.schemas.settings import DsecSettings
from dsec.services.stack import sink_group

FAULTS = ("metrics-leader", "active-controller", "stream-jobs")
SAMPLE_KINDS = ("heartbeat", "step", "episode", "gpu", "grad_sync")
# One feature per metric batch: its count says how far the stream jobs have come.
PROGRESS_FEATURE = "grad_sync_success_rate"


class FaultsBenchError(RuntimeError):
    def __init__(self, message: str, logs: Path) -> None:
        super().__init__(f"{message}; logs in {logs}")
        self.logs = logs


@dataclass(frozen=True)
class FaultsOptions:
    workers: int = 8
    flush_interval_s: float = 1.0
    warmup_s: float = 15.0
    settle_s: float = 5.0
    recovery_timeout_s: float = 180.0
    drain_timeout_s: float = 180.0
    heap_mb: int = 384
    brokers: int = 3


def _wait(ready: Callable[[], bool], timeout_s: float, what: str, logs: Path) -> float:
    started = time.monotonic()
    while not ready():
        if time.monotonic() - started > timeout_s:
            raise FaultsBenchError(f"{what} not within {timeout_s} s", logs)
        time.sleep(0.25)
    return time.monotonic() - started


class _Pipeline:
    """The services and what the store says about the load's job."""

    def __init__(self, settings: DsecSettings, work: Path) -> None:
        self.settings = settings
        self.sink_settings = settings.model_copy(update={"data_dir": work / "sink"})
        env = {**os.environ, **signing_env(settings),
               "DSEC_BOOTSTRAP": settings.bootstrap, "DSEC_TOPIC_PREFIX": settings.topic_prefix,
               "DSEC_JOB_ID": settings.job_id,
               "DSEC_REPLICATION_FACTOR": str(settings.replication_factor),
               # a SIGKILLed stream job's partitions move on after this, not Faust's 60 s
               "DSEC_STREAM_SESSION_TIMEOUT_S": "10", "DSEC_METRICS_PORT": "0"}
        self.services = {name: ServiceProcess(name, work / name, env)
                         for name in ("sink", "stream-jobs", "policy-engine")}

    def progress(self) -> tuple[int, int]:
        """(batches stored, batches turned into features) of the load's job."""
        try:
            rows = query(self.sink_settings, f"""
                SELECT (SELECT uniqExact(worker_id, event_time) FROM {raw_table_name('heartbeat')}
                        WHERE job_id = {{job:String}}),
                       (SELECT uniqExact(event_id) FROM features
                        WHERE job_id = {{job:String}} AND feature = '{PROGRESS_FEATURE}')""",
                         {"job": self.settings.job_id})["rows"]
        except HistoryError:
            return 0, 0
        return int(rows[0][0]), int(rows[0][1])

    def caught_up_with(self, batches: int) -> bool:
        stored, featured = self.progress()
        return stored >= batches and featured >= batches

    def stored_samples(self) -> tuple[set[str], int, int]:
        """(batches stored, as ``batch_key`` names them; distinct samples stored; samples
        stored more than once). A sample is its worker, its time and its place in its
        message."""
        job = {"job": self.settings.job_id}
        ids = {row[0] for row in query(self.sink_settings, f"""
            SELECT DISTINCT concat(worker_id, '@', toString(toUnixTimestamp64Milli(event_time)))
            FROM {raw_table_name('heartbeat')}
            WHERE job_id = {{job:String}}""", job)["rows"]}
        distinct = doubled = 0
        for kind in SAMPLE_KINDS:
            rows = query(self.sink_settings, f"""
                SELECT count(), uniqExact(worker_id, event_time, seq) FROM {raw_table_name(kind)}
                WHERE job_id = {{job:String}}""", job)["rows"]
            distinct += int(rows[0][1])
            doubled += int(rows[0][0]) - int(rows[0][1])
        return ids, distinct, doubled


def _kill_broker(cluster: LocalKafkaCluster, pipeline: _Pipeline, load: LiveLoad,
                 node_id: int, options: FaultsOptions, work: Path) -> dict[str, object]:
    topics = topic_names(pipeline.settings.topic_prefix)
    target = load.snapshot().produced_batches + options.workers
    cluster.kill(node_id)
    recovery_s = _wait(lambda: pipeline.caught_up_with(target), options.recovery_timeout_s,
                       f"the pipeline back after node {node_id} was killed", work)
    restart_started = time.monotonic()
    cluster.restart(node_id)
    restart_s = time.monotonic() - restart_started
    in_sync_s = cluster.wait_in_sync([topics.metrics, topics.features],
                                     options.recovery_timeout_s)
    return {"node": node_id, "recovery_s": round(recovery_s, 2),
            "restart_s": round(restart_s, 2), "in_sync_after_restart_s": round(in_sync_s, 2)}


def _kill_stream_jobs(pipeline: _Pipeline, load: LiveLoad, options: FaultsOptions,
                      work: Path) -> dict[str, object]:
    service = pipeline.services["stream-jobs"]
    killed_at = time.monotonic()
    service.kill()
    service.start()
    restart_s = time.monotonic() - killed_at
    target = load.snapshot().produced_batches + options.workers
    recovery_s = restart_s + _wait(lambda: pipeline.caught_up_with(target),
                                   options.recovery_timeout_s,
                                   "the stream jobs back after the kill", work)
    return {"recovery_s": round(recovery_s, 2), "restart_s": round(restart_s, 2)}


def run_faults_bench(options: FaultsOptions,
                     say: Callable[[str], None] = lambda _line: None) -> dict[str, object]:
    work = Path(tempfile.mkdtemp(prefix="dsec-bench-faults-"))
    started_s = time.monotonic()
    cluster = LocalKafkaCluster(work / "kafka", brokers=options.brokers, heap_mb=options.heap_mb)
    pipeline: _Pipeline | None = None
    load: LiveLoad | None = None
    try:
        bootstrap = cluster.start()
        say(f"{options.brokers} Kafka nodes on {bootstrap}")
        replicas = min(3, options.brokers)
        settings = DsecSettings(bootstrap=bootstrap, topic_prefix="faults", job_id="faults",
                                data_dir=work / "data", replication_factor=replicas,
                                metrics_port=0)
        topics = topic_names(settings.topic_prefix)
        ensure_topics(settings)
        cluster.wait_in_sync([topics.metrics], options.recovery_timeout_s)
        pipeline = _Pipeline(settings, work)
        for service in pipeline.services.values():
            service.start()
        say("sink, stream jobs and policy engine started")
        profile = LoadProfile(flush_interval_s=options.flush_interval_s)
        load = LiveLoad(settings, worker_identities(settings.job_id, 0, options.workers, 8),
                        profile).start()
        _wait(lambda: pipeline.caught_up_with(1), options.recovery_timeout_s,
              "the first features", work)
        time.sleep(options.warmup_s)
        target = load.snapshot().produced_batches + options.workers
        baseline_s = _wait(lambda: pipeline.caught_up_with(target), options.recovery_timeout_s,
                           "the pipeline catching up with no fault", work)
        say(f"baseline catch-up {baseline_s:.2f} s")
        faults: list[dict[str, object]] = []
        leaders = Counter(cluster.leaders(topics.metrics).values())
        leader = leaders.most_common(1)[0][0]
        faults.append({"fault": "kill -9 the leader of the metrics partitions",
                       "partitions_led": leaders[leader],
                       **_kill_broker(cluster, pipeline, load, leader, options, work)})
        say(f"{faults[-1]}")
        time.sleep(options.settle_s)
        controller = cluster.active_controller()
        if controller is None:
            raise FaultsBenchError("no active controller found", work)
        faults.append({"fault": "kill -9 the active controller",
                       **_kill_broker(cluster, pipeline, load, controller, options, work),
                       "new_controller": None})
        faults[-1]["new_controller"] = cluster.active_controller()
        say(f"{faults[-1]}")
        time.sleep(options.settle_s)
        faults.append({"fault": "kill -9 the stream-job process",
                       **_kill_stream_jobs(pipeline, load, options, work)})
        say(f"{faults[-1]}")
        time.sleep(options.settle_s)
        sent = load.stop()
        load = None
        sink = consumer_config(settings, sink_group(settings))
        if not wait_until_drained(sink, [topics.metrics], options.drain_timeout_s):
            raise FaultsBenchError("the sink did not read everything", work)
        stored_ids, stored_samples, doubled = pipeline.stored_samples()
        lost_ids = sent.acked_keys - stored_ids
    finally:
        if load is not None:
            load.stop(timeout_s=10.0)
        if pipeline is not None:
            for service in reversed(pipeline.services.values()):
                service.stop()
        cluster.stop()
    shutil.rmtree(work, ignore_errors=True)  # kept above for its logs when the bench failed
    return {
        "brokers": options.brokers,
        "replication_factor": replicas,
        "min_insync_replicas": min_insync_replicas(replicas),
        "workers": options.workers,
        "flush_interval_s": options.flush_interval_s,
        "batches_sent": sent.acked_batches,
        "batches_failed": sent.failed_batches,
        "samples_sent": sent.acked_samples,
        "samples_stored": stored_samples,
        "samples_lost": len(lost_ids) * profile.samples_per_flush,
        "samples_doubled": doubled,
        "batches_lost": len(lost_ids),
        "batches_stored_not_acknowledged": len(stored_ids - sent.acked_keys),
        "baseline_catch_up_s": round(baseline_s, 2),
        "faults": faults,
        "wall_s": round(time.monotonic() - started_s, 1),
        "cpu_count": os.cpu_count(),
    }
