"""The local stack: Kafka (ours, unless a bootstrap is given), topics, the ClickHouse store
and its sink, the stream jobs and the policy engine, in one process until interrupted.

Each process serves ``/metrics`` and ``/healthz`` on ``metrics_host:metrics_port``; when
the sink runs in a child process beside the Faust services, the child serves on
``metrics_port + 1``. The state file names every service's endpoint
(``metrics_endpoints``: service -> URL)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from dsec.infra.collector import tune_collector
from dsec.infra.faust_app import QuietWorker, make_faust_app, watch_faust_app
from dsec.infra.kafka_clients import BULK_FETCH, consumer_config, producer_config
from dsec.infra.kafka_local import LocalKafka, die_with_parent
from dsec.infra.observability.metrics import ProcessMetrics
from dsec.infra.observability.server import MetricsServer, serve_metrics
from dsec.infra.stop_signals import StopSignals
from dsec.infra.store.clickhouse import connect, ensure_schema
from dsec.infra.store.query_server import QueryServer
from dsec.infra.store.sink import ClickHouseSink
from dsec.infra.topics import ensure_changelog_topics, ensure_topics
from dsec.infra.usage_reporter import UsageReporter
from dsec.policy_engine.service import register as register_policy_engine
from dsec.schemas import topic_names
from dsec.schemas.settings import DsecSettings
from dsec.schemas.topics import TopicNames
from dsec.services.alert_notifier import AlertNotifier
from dsec.services.personality import PersonalityService
from dsec.stream_jobs.agent import METRICS_JOB_TABLES, register_metrics_job
from dsec.stream_jobs.card_agent import CARD_JOB_TABLES, register_card_job
from dsec.stream_jobs.fleet_agent import FLEET_JOB_TABLES, register_fleet_job
from dsec.stream_jobs.fleet_features import FleetConfig
from dsec.stream_jobs.worker_features import FeatureConfig

log = logging.getLogger(__name__)
STATE_FILE = "stack.json"
# How long a starting sink waits for the embedded store held by the sink before it.
STORE_LOCK_WAIT_S = 60.0


def sink_group(settings: DsecSettings) -> str:
    return f"{settings.topic_prefix}-clickhouse-sink"


def read_stack_state(data_dir: Path) -> dict | None:
    """The running stack's address book, if a live stack wrote one."""
    path = data_dir / STATE_FILE
    try:
        state = json.loads(path.read_text())
        os.kill(int(state["pid"]), 0)
    except (OSError, ValueError, KeyError):
        return None
    return state


def _write_state(data_dir: Path, state: dict) -> Path:
    path = data_dir / STATE_FILE
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(state, handle)
    tmp.replace(path)
    return path


def _partition_count(settings: DsecSettings, topic: str) -> int:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": settings.bootstrap, **settings.kafka_security()})
    return len(admin.list_topics(topic, timeout=30).topics[topic].partitions)


SERVICES = ("stream-jobs", "policy-engine", "sink", "alert-notifier")
# Run only when asked for (`--services ...,placement`): the personality job.
OPTIONAL_SERVICES = ("placement",)
FAUST_SERVICES = frozenset({"stream-jobs", "policy-engine"})


def stream_group(settings: DsecSettings, services: frozenset[str]) -> str:
    """The Faust app id (consumer group) of the stream services a process runs: processes
    running the same services share partitions; different sets never share a group."""
    faust_services = sorted(services & FAUST_SERVICES)
    return f"{settings.topic_prefix}-{'.'.join(faust_services)}"


@dataclass
class StackOptions:
    start_kafka: bool = True
    kafka_port: int = 0
    partitions: int | None = None
    window_episodes: int = 20
    services: frozenset[str] = frozenset(SERVICES)
    sink_in_own_process: bool = True


def _wait_for_signal() -> None:
    StopSignals().wait()


def _start_sink_process(
    settings: DsecSettings, data_dir: Path, stopping: threading.Event, timeout_s: float = 120.0
) -> subprocess.Popen[bytes]:
    """``dsec up --services sink`` beside this process; returns once it serves queries.
    If it dies while this stack runs, this stack stops too (a supervisor restarts both)."""
    command = [sys.executable, "-m", "dsec.cli", "up", "--bootstrap", settings.bootstrap,
               "--services", "sink", "--data-dir", str(data_dir)]
    env = {**os.environ, "DSEC_TOPIC_PREFIX": settings.topic_prefix,
           "DSEC_METRICS_PORT": str(sink_metrics_port(settings))}
    # A session of its own: a terminal's Ctrl-C reaches this process, which then stops the
    # sink after the stream jobs, instead of both at once.
    process = subprocess.Popen(command, env=env, preexec_fn=die_with_parent,
                               start_new_session=True)
    deadline = time.monotonic() + timeout_s
    # Its own state file: a killed stack's sink may still be stopping, its file still there.
    while (read_stack_state(data_dir) or {}).get("pid") != process.pid:
        if process.poll() is not None or time.monotonic() > deadline:
            stop_process(process)
            raise RuntimeError("the ClickHouse sink process did not start")
        time.sleep(0.1)

    def watch() -> None:
        process.wait()
        if not stopping.is_set():
            log.error("the ClickHouse sink process exited (%s); stopping", process.returncode)
            os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="dsec-sink-watch", daemon=True).start()
    return process


def sink_metrics_port(settings: DsecSettings) -> int:
    """The metrics port of a sink child process: the next one up (0 stays 0: off)."""
    return settings.metrics_port + 1 if settings.metrics_port else 0


def _record_metrics_endpoints(data_dir: Path, endpoints: dict[str, str]) -> None:
    """Adds this process's endpoints to the state file its sink child wrote."""
    state = read_stack_state(data_dir)
    if state is None:
        return
    state["metrics_endpoints"] = {**state.get("metrics_endpoints", {}), **endpoints}
    _write_state(data_dir, state)


def stop_process(process: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_stack(settings: DsecSettings, options: StackOptions) -> None:
    """Runs until SIGINT/SIGTERM; everything started here is stopped on the way out."""
    unknown = options.services - set(SERVICES) - set(OPTIONAL_SERVICES)
    if unknown or not options.services:
        raise ValueError(f"services must be among {', '.join(SERVICES)}; got {sorted(unknown)}")
    data_dir = settings.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    kafka: LocalKafka | None = None
    sink: ClickHouseSink | None = None
    sink_process: subprocess.Popen[bytes] | None = None
    query_server: QueryServer | None = None
    notifier: AlertNotifier | None = None
    personalities: PersonalityService | None = None
    usage: UsageReporter | None = None
    state_path: Path | None = None
    stopping = threading.Event()
    metrics = ProcessMetrics()
    # Served first, so that /healthz answers (503) while the services start; each service
    # adds its own check as it starts.
    set_up = threading.Event()
    metrics.add_health_check("stack", lambda: None if set_up.is_set() else "starting")
    metrics_server = serve_metrics(settings, metrics)
    try:
        if options.start_kafka:
            kafka = LocalKafka(data_dir=data_dir / "kafka", port=options.kafka_port)
            settings = settings.model_copy(update={"bootstrap": kafka.start()})
            log.warning("Kafka broker on %s", settings.bootstrap)
        topics = topic_names(settings.topic_prefix)
        ensure_topics(settings, partitions=options.partitions)
        state: dict = {"pid": os.getpid(), "bootstrap": settings.bootstrap,
                       "topic_prefix": settings.topic_prefix,
                       "services": sorted(options.services)}
        faust_services = options.services & FAUST_SERVICES
        endpoints = _endpoints(metrics_server, options.services)
        in_this_process = options.services
        if "sink" in options.services and faust_services and options.sink_in_own_process:
            in_this_process = options.services - {"sink"}
        if settings.usage_report_interval_s > 0:
            # What this process costs, for `dsec report cost` (the sink child reports its own).
            usage = UsageReporter(producer_config(settings, "dsec-usage"), topics.process_usage,
                                  ",".join(sorted(in_this_process)),
                                  settings.usage_report_interval_s).start()
        if "sink" in options.services and faust_services and options.sink_in_own_process:
            # The sink decodes every sample again and writes them all: on its own process it
            # runs beside the stream jobs instead of sharing their interpreter lock.
            sink_process = _start_sink_process(settings, data_dir, stopping)
            _record_metrics_endpoints(data_dir, _endpoints(metrics_server,
                                                           options.services - {"sink"}))
        elif "sink" in options.services:
            sink, query_server = _start_embedded_sink(settings, topics, metrics)
            state.update(query_port=query_server.port, query_token=query_server.token,
                         clickhouse=settings.clickhouse_target())
        if sink_process is None:
            state["metrics_endpoints"] = endpoints
            state_path = _write_state(data_dir, state)
        if "alert-notifier" in options.services:
            notifier = AlertNotifier(settings, metrics)
            notifier.start()
        if "placement" in options.services:
            personalities = PersonalityService(settings, metrics)
            personalities.start()
        if not faust_services:
            _tune_collector(settings)
            set_up.set()
            _wait_for_signal()
            return
        app = _faust_app(settings, options, topics, metrics)
        _tune_collector(settings)
        set_up.set()
        worker = QuietWorker(app, loglevel=settings.log_level, quiet=True, redirect_stdouts=False)
        with contextlib.suppress(SystemExit):
            worker.execute_from_commandline()
    finally:
        stopping.set()
        if sink_process is not None:
            stop_process(sink_process)
        if state_path is not None:
            state_path.unlink(missing_ok=True)
        if notifier is not None:
            notifier.stop()
        if personalities is not None:
            personalities.stop()
        if usage is not None:
            usage.stop()
        if query_server is not None:
            query_server.stop()
        if sink is not None:
            sink.stop()
        if kafka is not None:
            kafka.stop()
        if metrics_server is not None:
            metrics_server.stop()


def _tune_collector(settings: DsecSettings) -> None:
    """The collector as a service wants it, once what the process loads at start is in."""
    if settings.gc_young_objects:
        tune_collector(settings.gc_young_objects)


def _start_embedded_sink(settings: DsecSettings, topics: TopicNames,
                         metrics: ProcessMetrics) -> tuple[ClickHouseSink, QueryServer]:
    """The sink in this process, and the query server on its store."""
    # A sink whose stack was killed gets SIGTERM and may still be closing the store.
    client = connect(settings.clickhouse_target(), wait_for_lock_s=STORE_LOCK_WAIT_S)
    ensure_schema(client, settings.clickhouse_ttl_days)
    client_lock = threading.Lock()
    sink = ClickHouseSink(
        client, client_lock,
        consumer_config(settings, sink_group(settings), **BULK_FETCH), topics,
        producer_config(settings, "dsec-clickhouse-sink"), metrics=metrics,
        event_times=settings.event_time_window(),
    )
    sink.start()
    query_server = QueryServer(client, client_lock)
    query_server.start()
    return sink, query_server


def _faust_app(settings: DsecSettings, options: StackOptions, topics: TopicNames,
               metrics: ProcessMetrics):
    """The Faust app of the stream jobs and the policy engine this stack runs, watched."""
    app = make_faust_app(
        stream_group(settings, options.services), settings,
        partitions=_partition_count(settings, topics.metrics),
    )
    services_by_topic: dict[str, str] = {}
    if "stream-jobs" in options.services:
        ensure_changelog_topics(settings, app.conf.id,
                                [*METRICS_JOB_TABLES, *CARD_JOB_TABLES, *FLEET_JOB_TABLES],
                                app.conf.topic_partitions)
        register_metrics_job(
            app, topics, FeatureConfig(reward_window_episodes=options.window_episodes),
            metrics=metrics, event_times=settings.event_time_window(),
        )
        register_card_job(app, topics)
        register_fleet_job(
            app, topics, FleetConfig(window_s=settings.fleet_window_s,
                                     publish_interval_s=settings.fleet_publish_interval_s),
            metrics=metrics)
        services_by_topic.update({topics.metrics: "stream-jobs",
                                  topics.gpu_cards: "stream-jobs",
                                  topics.fleet_inputs: "stream-jobs"})
    if "policy-engine" in options.services:
        register_policy_engine(app, settings, metrics=metrics)
        services_by_topic.update({topics.features: "policy-engine",
                                  topics.policies: "policy-engine",
                                  topics.pools: "policy-engine"})
    watch_faust_app(app, metrics, services_by_topic)
    return app


def _endpoints(server: MetricsServer | None, services: frozenset[str]) -> dict[str, str]:
    return {service: server.url for service in sorted(services)} if server else {}
