"""The Prometheus metric catalogue: every name a dsec service process exposes, with its type,
labels and unit, and the per-process registry the services count into.

Each process has a registry of its own (never prometheus_client's global one) and only the
instruments its services made, so a gauge that means nothing in a process (pool
utilisation in the sink) is absent there rather than a misleading zero.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dsec.schemas import ActionKind

MetricKind = Literal["counter", "gauge", "histogram"]

# Batch and evaluation times: a batch of 500 probe messages takes tens of milliseconds.
_PROCESSING_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                         5.0, 10.0)
# Resume times: the article's bar is 2.7 s, the meta-policy's threshold 8 s.
_RECOVERY_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 300.0)


@dataclass(frozen=True)
class MetricSpec:
    """One metric family; ``name`` is the name as scraped (counters end in ``_total``)."""

    name: str
    kind: MetricKind
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()

    @property
    def family_name(self) -> str:
        """The name prometheus_client is given: it appends ``_total`` to counters itself."""
        return self.name.removesuffix("_total") if self.kind == "counter" else self.name


EVENTS_IN = MetricSpec(
    "dsec_events_in_total", "counter",
    "Messages consumed, by service and source topic (the ingest gateway: 'http' for "
    "accepted HTTP batches).",
    ("service", "topic"))
EVENTS_OUT = MetricSpec(
    "dsec_events_out_total", "counter",
    "Messages published, by service and destination topic (the sink: rows written, by "
    "ClickHouse table, and dead letters published).",
    ("service", "topic"))
EVENTS_DEAD_LETTERED = MetricSpec(
    "dsec_events_dead_lettered_total", "counter",
    "Messages sent to the dead-letter topic, by service and reason class "
    "(empty, not_json, invalid; the sink: store_rejected, unpreparable; handler_failed: a "
    "message a consumer loop or a stream job's batch failed on).",
    ("service", "reason"))
CONSUMER_LAG = MetricSpec(
    "dsec_consumer_lag_messages", "gauge",
    "Messages between the consumer group's position and the end of each assigned partition.",
    ("service", "topic", "partition"))
FEATURE_UPDATE_LATENCY = MetricSpec(
    "dsec_feature_update_latency_seconds", "histogram",
    "Time the metrics job takes for one batch of probe messages, from decoding to its "
    "features and profiles being delivered.",
    buckets=_PROCESSING_BUCKETS_S)
POLICY_EVALUATION_LATENCY = MetricSpec(
    "dsec_policy_evaluation_latency_seconds", "histogram",
    "Time the policy engine takes to evaluate one batch of feature events.",
    buckets=_PROCESSING_BUCKETS_S)
MELT_DOWN_COUNT = MetricSpec(
    "dsec_melt_down_count", "gauge",
    "Circuit-breaker trips in the last hour per pool and job (policies named *breaker*, "
    "meta-policies aside; pool empty: the whole job), from the fleet features.",
    ("pool", "job"))
BREAKER_TRIPS = MetricSpec(
    "dsec_breaker_trips_total", "counter",
    "Circuit-breaker trips since the process started.")
GRADIENT_SYNC_SUCCESS_RATE = MetricSpec(
    "dsec_gradient_sync_success_rate", "gauge",
    "Successful gradient syncs over all syncs of the last hour, per pool and job (ratio "
    "0..1; pool empty: the whole job), from the fleet features.",
    ("pool", "job"))
SNAPSHOT_RECOVERY_TIME = MetricSpec(
    "dsec_snapshot_recovery_time_seconds", "histogram",
    "How long workers took to resume from a snapshot, from their recovery samples.",
    buckets=_RECOVERY_BUCKETS_S)
SANDBOX_UTILIZATION_RATE = MetricSpec(
    "dsec_sandbox_utilization_rate", "gauge",
    "Mean device utilisation over the last hour per pool and job (ratio 0..1; pool empty: "
    "the whole job), from the fleet features; no sample while none reported.",
    ("pool", "job"))
ACTUATIONS = MetricSpec(
    "dsec_actuations_total", "counter",
    "Actuation commands by service, action and result (the policy engine: emitted; the "
    "node actuator and the gateway's webhooks: applied, deferred, unsupported, failed, "
    "rejected, stale, superseded).",
    ("service", "action", "result"))
PROBE_SAMPLES_DROPPED = MetricSpec(
    "dsec_probe_samples_dropped_total", "counter",
    "Samples a worker's probe dropped since it started, relayed from its heartbeats.",
    ("worker",))
REQUESTS_REJECTED = MetricSpec(
    "dsec_requests_rejected_total", "counter",
    "HTTP requests refused, by service and reason (the ingest gateway: unauthorized, "
    "forbidden, too_large, invalid_json, too_deep, invalid_request, rate_limited, ...).",
    ("service", "reason"))
ALERT_NOTIFICATIONS = MetricSpec(
    "dsec_alert_notifications_total", "counter",
    "Alert notifications posted to webhook receivers, by alert status (firing, resolved) "
    "and result (delivered, failed: refused after every attempt).",
    ("status", "result"))
WORKERS_LOST = MetricSpec(
    "dsec_workers_lost", "gauge",
    "Workers silent for 3 heartbeat intervals while others go on, among those whose state "
    "this process holds.")

CATALOGUE: tuple[MetricSpec, ...] = (
    EVENTS_IN, EVENTS_OUT, EVENTS_DEAD_LETTERED, CONSUMER_LAG, FEATURE_UPDATE_LATENCY,
    POLICY_EVALUATION_LATENCY, MELT_DOWN_COUNT, BREAKER_TRIPS, GRADIENT_SYNC_SUCCESS_RATE,
    SNAPSHOT_RECOVERY_TIME, SANDBOX_UTILIZATION_RATE, ACTUATIONS, PROBE_SAMPLES_DROPPED,
    WORKERS_LOST, REQUESTS_REJECTED, ALERT_NOTIFICATIONS,
)
METRIC_NAMES: tuple[str, ...] = tuple(spec.name for spec in CATALOGUE)

# What each service exposes (a process running several services exposes their union).
SERVICE_METRICS: dict[str, tuple[MetricSpec, ...]] = {
    "stream-jobs": (EVENTS_IN, EVENTS_OUT, EVENTS_DEAD_LETTERED, CONSUMER_LAG,
                    FEATURE_UPDATE_LATENCY, GRADIENT_SYNC_SUCCESS_RATE, SNAPSHOT_RECOVERY_TIME,
                    SANDBOX_UTILIZATION_RATE, MELT_DOWN_COUNT, PROBE_SAMPLES_DROPPED,
                    WORKERS_LOST),
    "policy-engine": (EVENTS_IN, EVENTS_OUT, EVENTS_DEAD_LETTERED, CONSUMER_LAG,
                      POLICY_EVALUATION_LATENCY, BREAKER_TRIPS, ACTUATIONS),
    "sink": (EVENTS_IN, EVENTS_OUT, EVENTS_DEAD_LETTERED, CONSUMER_LAG),
    "ingest-gateway": (EVENTS_IN, EVENTS_OUT, EVENTS_DEAD_LETTERED, CONSUMER_LAG, ACTUATIONS,
                       REQUESTS_REJECTED),
    "node-actuator": (EVENTS_IN, EVENTS_OUT, EVENTS_DEAD_LETTERED, CONSUMER_LAG, ACTUATIONS),
    "alert-notifier": (EVENTS_IN, EVENTS_OUT, EVENTS_DEAD_LETTERED, CONSUMER_LAG,
                       ALERT_NOTIFICATIONS),
}


STORE_REJECTED = "store_rejected"  # the reason class of what ClickHouse refused to store


def dead_letter_reason(reason: str) -> str:
    """A bounded label for a dead letter's reason (the reason itself names fields and values)."""
    if "tombstone" in reason:
        return "empty"
    if "not JSON" in reason:
        return "not_json"
    return "invalid"


_ACTION_KINDS = frozenset(kind.value for kind in ActionKind)


def action_label(kind: str) -> str:
    """An action kind as a label: the known kinds, else ``unknown`` (the kind of a malformed
    command comes from its sender)."""
    return kind if kind in _ACTION_KINDS else "unknown"


def is_breaker_trip(policy_name: str, decision: str) -> bool:
    """A circuit-breaker policy fired; as in the ``breaker_trips_by_hour`` query, breakers
    are the policies named ``*breaker*``, and the meta-policies that tune them are not."""
    return decision == "fired" and "breaker" in policy_name and not policy_name.startswith(
        "meta-")


HealthCheck = Callable[[], str | None]  # None when healthy, else why not


class LatestValues(Collector):
    """The latest value per label set, as given (a gauge, or a counter relayed from elsewhere
    such as a probe's heartbeat). Label sets not updated for ``ttl_s`` are dropped, so a
    worker that moved to another process stops being reported here."""

    def __init__(self, spec: MetricSpec, ttl_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if spec.kind == "histogram":
            raise ValueError(f"{spec.name}: latest values are gauges or counters")
        self.spec = spec
        self._ttl_s = ttl_s
        self._clock = clock
        self._values: dict[tuple[str, ...], tuple[float, float]] = {}
        self._lock = threading.Lock()

    def set(self, labels: tuple[str, ...], value: float) -> None:
        with self._lock:
            self._values[labels] = (value, self._clock())

    def set_many(self, values: Iterable[tuple[tuple[str, ...], float]]) -> None:
        now = self._clock()
        with self._lock:
            for labels, value in values:
                self._values[labels] = (value, now)

    def values(self) -> dict[tuple[str, ...], float]:
        horizon = self._clock() - self._ttl_s
        with self._lock:
            for labels in [k for k, (_, at) in self._values.items() if at < horizon]:
                del self._values[labels]
            return {labels: value for labels, (value, _) in self._values.items()}

    def collect(self) -> Iterator[Metric]:
        family_type = CounterMetricFamily if self.spec.kind == "counter" else GaugeMetricFamily
        family = family_type(self.spec.family_name, self.spec.help, labels=self.spec.labels)
        for labels, value in sorted(self.values().items()):
            family.add_metric(labels, value)
        yield family

    def describe(self) -> Iterator[Metric]:
        family_type = CounterMetricFamily if self.spec.kind == "counter" else GaugeMetricFamily
        yield family_type(self.spec.family_name, self.spec.help, labels=self.spec.labels)


class MeanOfLatest(Collector):
    """An unlabelled gauge: the mean of the latest value of each key (a worker, say) set
    within ``ttl_s``. No sample while there is none, rather than a NaN that would spoil an
    average taken across processes."""

    def __init__(self, spec: MetricSpec, ttl_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if spec.kind != "gauge" or spec.labels:
            raise ValueError(f"{spec.name}: a mean of latest values is an unlabelled gauge")
        self.spec = spec
        self.latest = LatestValues(spec, ttl_s, clock)

    def set_many(self, values: Iterable[tuple[tuple[str, ...], float]]) -> None:
        self.latest.set_many(values)

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self.spec.family_name, self.spec.help)
        values = self.latest.values()
        if values:
            family.add_metric([], math.fsum(values.values()) / len(values))
        yield family

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self.spec.family_name, self.spec.help)


class RecentEvents:
    """Times of recent events, counted over a sliding window (e.g. breaker trips per hour)."""

    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._window_s = window_s
        self._clock = clock
        self._times: deque[float] = deque()
        self._lock = threading.Lock()

    def add(self, count: int = 1) -> None:
        now = self._clock()
        with self._lock:
            self._times.extend([now] * count)

    def count(self) -> int:
        horizon = self._clock() - self._window_s
        with self._lock:
            while self._times and self._times[0] < horizon:
                self._times.popleft()
            return len(self._times)


class ProcessMetrics:
    """One process's metrics and health checks, served by ``MetricsServer``.

    Instruments are made on first request and shared after, so two services in one
    process (stream jobs and policy engine under one Faust worker) count into the same
    families under their own ``service`` label.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._instruments: dict[str, object] = {}
        self._checks: dict[str, HealthCheck] = {}
        self._lock = threading.Lock()

    def _instrument(self, spec: MetricSpec, kind: MetricKind, make: Callable[[], object]):
        if spec.kind != kind:
            raise TypeError(f"{spec.name} is a {spec.kind}, not a {kind}")
        with self._lock:
            instrument = self._instruments.get(spec.name)
            if instrument is None:
                instrument = self._instruments[spec.name] = make()
            return instrument

    def counter(self, spec: MetricSpec) -> Counter:
        return self._instrument(spec, "counter", lambda: Counter(
            spec.family_name, spec.help, spec.labels, registry=self.registry))

    def gauge(self, spec: MetricSpec) -> Gauge:
        return self._instrument(spec, "gauge", lambda: Gauge(
            spec.family_name, spec.help, spec.labels, registry=self.registry))

    def histogram(self, spec: MetricSpec) -> Histogram:
        return self._instrument(spec, "histogram", lambda: Histogram(
            spec.family_name, spec.help, spec.labels, registry=self.registry,
            buckets=spec.buckets or Histogram.DEFAULT_BUCKETS))

    def latest(self, spec: MetricSpec, ttl_s: float = 300.0) -> LatestValues:
        def make() -> LatestValues:
            collector = LatestValues(spec, ttl_s)
            self.registry.register(collector)
            return collector

        return self._instrument(spec, spec.kind, make)

    def mean_of_latest(self, spec: MetricSpec, ttl_s: float) -> MeanOfLatest:
        def make() -> MeanOfLatest:
            collector = MeanOfLatest(spec, ttl_s)
            self.registry.register(collector)
            return collector

        return self._instrument(spec, "gauge", make)

    def gauge_function(self, spec: MetricSpec, read: Callable[[], float]) -> Gauge:
        """An unlabelled gauge whose value is read when scraped."""
        gauge = self.gauge(spec)
        gauge.set_function(read)
        return gauge

    def add_health_check(self, name: str, check: HealthCheck) -> None:
        with self._lock:
            self._checks[name] = check

    def health(self) -> tuple[bool, dict[str, str]]:
        """Healthy when every check passes; the second item says how each one stands."""
        with self._lock:
            checks = dict(self._checks)
        report: dict[str, str] = {}
        healthy = True
        for name, check in sorted(checks.items()):
            try:
                problem = check()
            except Exception as exc:  # a broken check is a failing check, not a crash
                problem = f"check failed: {type(exc).__name__}: {exc}"
            report[name] = "ok" if problem is None else problem
            healthy = healthy and problem is None
        return healthy, report

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)
