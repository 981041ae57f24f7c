"""``dsec bench soak``: many synthetic workers at real probe rates through the whole stack
for a long time, watching what grows.

Each part runs in its own process: the Kafka broker (the project's own, unless
``bootstrap``), the sink into chDB, the stream jobs and the policy engine (``dsec up
--services ...``), a node actuator per node of a subset (a few of each such node's
workers registered on it, answering snapshots), and a few load processes
(``dsec.bench.live_load``) each publishing for hundreds of workers: a flush every
``flush_interval_s`` with its heartbeat, step samples, episodes, gradient syncs and a GPU
reading. Every ``sample_interval_s`` the soak reads each service's resident memory
(``/proc/<pid>/status`` VmRSS) and each consumer group's lag. At the end it compares the
samples the brokers acknowledged with those stored, and counts the commands the policy
engine emitted and what the node actuators answered.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from dsec.bench.faults import SAMPLE_KINDS
from dsec.bench.service_processes import ServiceProcess, rss_bytes
from dsec.history import query
from dsec.infra.kafka_clients import consumer_config
from dsec.infra.kafka_local import LocalKafka, die_with_parent
from dsec.infra.keys import signing_env
from dsec.infra.store.raw_columns import raw_table_name
from dsec.infra.store.sink import wait_until_drained
from dsec.infra.topics import ensure_topics
from dsec.schemas import topic_names
from dsec.schemas.settings import DsecSettings
from dsec.services.stack import sink_group, stream_group

MIB = 1 << 20
RSS_FLAT_PCT = 10.0


class SoakBenchError(RuntimeError):
    def __init__(self, message: str, logs: Path) -> None:
        super().__init__(f"{message}; logs in {logs}")
        self.logs = logs


@dataclass(frozen=True)
class SoakOptions:
    workers: int = 1000
    duration_s: float = 600.0
    load_processes: int = 4
    actuator_nodes: int = 8
    attach_per_node: int = 4  # workers of each such node registered on its actuator
    flush_interval_s: float = 5.0  # as the probe's heartbeat: one flush carries one
    steps_per_flush: int = 25
    episodes_per_flush: int = 5
    syncs_per_flush: int = 5
    sample_interval_s: float = 10.0
    # RSS is compared from the end of the warm-up (a share of the run) to the end.
    warmup_fraction: float = 0.25
    drain_timeout_s: float = 300.0
    bootstrap: str | None = None  # a running broker; else the project's own is started
    heap_mb: int = 512


def group_lag(settings: DsecSettings, group: str, topic: str) -> int | None:
    """Messages of ``topic`` the group has not committed yet (None before it commits)."""
    consumer = Consumer(consumer_config(settings, group))
    try:
        metadata = consumer.list_topics(topic, timeout=10)
        partitions = [TopicPartition(topic, p) for p in metadata.topics[topic].partitions]
        committed = consumer.committed(partitions, timeout=10)
        lag, seen = 0, False
        for tp in committed:
            _low, high = consumer.get_watermark_offsets(tp, timeout=10)
            if tp.offset >= 0:
                seen = True
                lag += max(0, high - tp.offset)
            else:
                lag += high
        return lag if seen else None
    finally:
        consumer.close()


def _flat(series: list[int | None], warmup_index: int) -> tuple[float | None, bool]:
    """Growth (%) from the end of the warm-up to the end; flat when within the bound."""
    values = [v for v in series[warmup_index:] if v]
    if len(values) < 2:
        return None, True
    growth = 100.0 * (values[-1] - values[0]) / values[0]
    return round(growth, 1), growth <= RSS_FLAT_PCT


class _Soak:
    def __init__(self, options: SoakOptions, work: Path) -> None:
        self.options = options
        self.work = work
        self.kafka = None if options.bootstrap else LocalKafka(
            data_dir=work / "kafka", heap_mb=options.heap_mb)
        self.services: dict[str, ServiceProcess] = {}
        self.actuators: list[subprocess.Popen[bytes]] = []
        self.loads: list[subprocess.Popen[bytes]] = []
        # short, outside the work folder: socket paths are limited
        self.run_dir = Path(tempfile.mkdtemp(prefix="dsec-soak-run-"))

    def start(self) -> DsecSettings:
        bootstrap = self.options.bootstrap or self.kafka.start()  # type: ignore[union-attr]
        settings = DsecSettings(bootstrap=bootstrap, topic_prefix=f"soak{uuid.uuid4().hex[:8]}",
                                job_id="soak", data_dir=self.work / "data",
                                run_dir=self.run_dir,
                                metrics_port=0)
        ensure_topics(settings)
        self.env = {**os.environ, **signing_env(settings), "DSEC_BOOTSTRAP": bootstrap,
                    "DSEC_TOPIC_PREFIX": settings.topic_prefix, "DSEC_JOB_ID": settings.job_id,
                    "DSEC_RUN_DIR": str(settings.run_dir), "DSEC_METRICS_PORT": "0",
                    "DSEC_POLICY_DRY_RUN": "0", "PYTHONUNBUFFERED": "1"}
        for name in ("sink", "stream-jobs", "policy-engine"):
            self.services[name] = ServiceProcess(name, self.work / name, self.env)
            self.services[name].start()
        for node in range(self.options.actuator_nodes):
            self.actuators.append(self._spawn(
                ["dsec.cli", "actuator", "--node", f"node-{node:02d}"], f"actuator-{node}.log"))
        return settings

    def _spawn(self, args: list[str], log_name: str) -> subprocess.Popen[bytes]:
        with (self.work / log_name).open("wb") as log:
            return subprocess.Popen([sys.executable, "-m", *args], env=self.env, stdout=log,
                                    stderr=subprocess.STDOUT, preexec_fn=die_with_parent)

    def start_load(self) -> None:
        o = self.options
        per = -(-o.workers // o.load_processes)
        for i, first in enumerate(range(0, o.workers, per)):
            self.loads.append(self._spawn(
                ["dsec.bench.live_load", "--first", str(first),
                 "--workers", str(min(per, o.workers - first)),
                 "--nodes", str(max(1, o.actuator_nodes)), "--duration-s", str(o.duration_s),
                 "--flush-interval-s", str(o.flush_interval_s),
                 "--steps-per-flush", str(o.steps_per_flush),
                 "--episodes-per-flush", str(o.episodes_per_flush),
                 "--syncs-per-flush", str(o.syncs_per_flush),
                 "--attach-per-node", str(o.attach_per_node if o.actuator_nodes else 0)],
                f"load-{i}.log"))

    def rss(self) -> dict[str, int | None]:
        """Resident memory per service, MiB; the node actuators' largest."""
        sizes = {name: rss_bytes(service.pid) if service.pid else None
                 for name, service in self.services.items()}
        if self.kafka is not None and self.kafka.pid is not None:
            sizes["kafka"] = rss_bytes(self.kafka.pid)
        actuators = [rss_bytes(p.pid) for p in self.actuators if p.poll() is None]
        sizes["node-actuator"] = max((a for a in actuators if a), default=None)
        return {name: None if size is None else size // MIB for name, size in sizes.items()}

    def load_totals(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for i, process in enumerate(self.loads):
            process.wait(timeout=self.options.drain_timeout_s)
            lines = (self.work / f"load-{i}.log").read_text().splitlines()
            counters = json.loads(next(line for line in reversed(lines) if line.startswith("{")))
            for name, value in counters.items():
                totals[name] = totals.get(name, 0) + value
        return totals

    def stop(self) -> None:
        for process in [*self.loads, *self.actuators]:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
        for service in reversed(self.services.values()):
            service.stop()
        if self.kafka is not None:
            self.kafka.stop()
        shutil.rmtree(self.run_dir, ignore_errors=True)


def _store_counts(settings: DsecSettings) -> dict[str, object]:
    job = {"job": settings.job_id}
    distinct = doubled = 0
    for kind in SAMPLE_KINDS:
        rows = query(settings, f"SELECT count(), uniqExact(worker_id, event_time, seq) FROM "
                               f"{raw_table_name(kind)} WHERE job_id = {{job:String}}", job)["rows"]
        distinct += int(rows[0][1])
        doubled += int(rows[0][0]) - int(rows[0][1])
    emitted = query(settings, "SELECT uniqExact(actuation_id) FROM actuations "
                              "WHERE job_id = {job:String}", job)["rows"][0][0]
    answers = query(settings, "SELECT status, uniqExact(actuation_id) FROM actuation_results "
                              "WHERE job_id = {job:String} GROUP BY status", job)["rows"]
    return {"samples_stored": distinct, "samples_doubled": doubled,
            "commands_emitted": int(emitted),
            "command_answers": {status: int(n) for status, n in answers}}


def run_soak(options: SoakOptions, say=lambda _line: None) -> dict[str, object]:
    work = Path(tempfile.mkdtemp(prefix="dsec-bench-soak-"))
    soak = _Soak(options, work)
    started_s = time.monotonic()
    timeline: list[dict[str, object]] = []
    try:
        settings = soak.start()
        sink_settings = settings.model_copy(update={"data_dir": work / "sink"})
        topics = topic_names(settings.topic_prefix)
        groups = {"sink": (sink_group(settings), topics.metrics),
                  "stream-jobs": (stream_group(settings, frozenset({"stream-jobs"})),
                                  topics.metrics),
                  "policy-engine": (stream_group(settings, frozenset({"policy-engine"})),
                                    topics.features)}
        say(f"stack up on {settings.bootstrap}; {options.workers} workers for "
            f"{options.duration_s:g} s")
        soak.start_load()
        load_started = time.monotonic()
        while any(process.poll() is None for process in soak.loads):
            elapsed = time.monotonic() - load_started
            point = {"t_s": round(elapsed, 1), "rss_mib": soak.rss(),
                     "lag_messages": {name: group_lag(settings, group, topic)
                                      for name, (group, topic) in groups.items()}}
            timeline.append(point)
            say(json.dumps(point))
            for name, service in soak.services.items():
                if service.pid is None:
                    raise SoakBenchError(f"the {name} service exited", work)
            if elapsed > options.duration_s + options.drain_timeout_s:
                raise SoakBenchError("the load processes did not end", work)
            time.sleep(options.sample_interval_s)
        sent = soak.load_totals()
        drained = wait_until_drained(consumer_config(settings, sink_group(settings)),
                                     [topics.metrics, topics.actuations,
                                      topics.actuation_results], options.drain_timeout_s)
        if not drained:
            raise SoakBenchError("the sink did not read everything", work)
        final_rss = soak.rss()
        stored = _store_counts(sink_settings)
    finally:
        soak.stop()
    shutil.rmtree(work, ignore_errors=True)  # kept above for its logs when the bench failed
    warmup_index = next((i for i, p in enumerate(timeline)
                         if float(p["t_s"]) >= options.warmup_fraction * options.duration_s),
                        len(timeline) - 1)  # type: ignore[arg-type]
    rss_series = {name: [p["rss_mib"].get(name) for p in timeline]  # type: ignore[union-attr]
                  for name in final_rss}
    growth = {name: _flat(series, warmup_index) for name, series in rss_series.items()}
    middle = timeline[len(timeline) // 2] if timeline else {"rss_mib": {}}
    peak_lag = {name: max((p["lag_messages"].get(name) or 0  # type: ignore[union-attr]
                           for p in timeline), default=0) for name in groups}
    lost = max(0, sent.get("acked_samples", 0) - int(stored["samples_stored"]))  # type: ignore[call-overload]
    return {
        "workers": options.workers,
        "duration_s": options.duration_s,
        "load_processes": options.load_processes,
        "actuator_nodes": options.actuator_nodes,
        "flush_interval_s": options.flush_interval_s,
        "samples_per_s": round(options.workers * (options.steps_per_flush
                                                  + options.episodes_per_flush
                                                  + options.syncs_per_flush + 2)
                               / options.flush_interval_s, 1),
        "batches_sent": sent.get("acked_batches", 0),
        "batches_failed": sent.get("failed_batches", 0),
        "samples_in": sent.get("acked_samples", 0),
        **stored,
        "samples_lost": lost,
        "attached_workers": sent.get("attached_workers", 0),
        "commands_applied": stored["command_answers"].get("applied", 0),  # type: ignore[union-attr]
        "rss_mib_start": timeline[0]["rss_mib"] if timeline else {},
        "rss_mib_middle": middle["rss_mib"],
        "rss_mib_end": timeline[-1]["rss_mib"] if timeline else {},
        "rss_growth_after_warmup_pct": {name: g for name, (g, _flat_ok) in growth.items()},
        "rss_flat": all(ok for _g, ok in growth.values()),
        "peak_lag_messages": peak_lag,
        "timeline": timeline,
        "wall_s": round(time.monotonic() - started_s, 1),
        "cpu_count": os.cpu_count(),
        "load_average_1m_end": round(os.getloadavg()[0], 1),
    }
