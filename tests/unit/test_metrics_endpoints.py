"""Prometheus metrics and health: the catalogue, the endpoint, and every service's /metrics
scraped on the real broker after traffic (stack, sink child, node actuator, gateway)."""

from __future__ import annotations

import re
import socket

import httpx
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from dsec.cli import app as cli
from dsec.infra.observability import METRIC_NAMES, SERVICE_METRICS, MetricsServer, ProcessMetrics
from dsec.infra.observability.kafka import ConsumerLag
from dsec.infra.observability.metrics import (
    CATALOGUE,
    EVENTS_IN,
    GRADIENT_SYNC_SUCCESS_RATE,
    MELT_DOWN_COUNT,
    LatestValues,
    MeanOfLatest,
    MetricSpec,
    RecentEvents,
    is_breaker_trip,
)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(base_url: str) -> Samples:
    """Every sample of ``base_url``/metrics: (sample name, labels) -> value."""
    response = httpx.get(f"{base_url}/metrics", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(response.text)
            for sample in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))




# --- the catalogue and the endpoint, without a broker --------------------------------------


def test_catalogue_names_follow_prometheus_conventions() -> None:
    assert len(set(METRIC_NAMES)) == len(METRIC_NAMES) == len(CATALOGUE)
    assert set(METRIC_NAMES) == {
        "dsec_events_in_total", "dsec_events_out_total", "dsec_events_dead_lettered_total",
        "dsec_consumer_lag_messages", "dsec_feature_update_latency_seconds",
        "dsec_policy_evaluation_latency_seconds", "dsec_melt_down_count",
        "dsec_breaker_trips_total", "dsec_gradient_sync_success_rate",
        "dsec_snapshot_recovery_time_seconds", "dsec_sandbox_utilization_rate",
        "dsec_actuations_total", "dsec_probe_samples_dropped_total", "dsec_workers_lost",
        "dsec_requests_rejected_total", "dsec_alert_notifications_total",
    }
    for spec in CATALOGUE:
        assert re.fullmatch(r"dsec_[a-z_]+", spec.name)
        assert spec.name.endswith("_total") == (spec.kind == "counter"), spec.name
        if spec.kind == "histogram":
            assert spec.name.endswith("_seconds") and spec.buckets, spec.name
        assert not {"event_id", "step", "actuation_id"} & set(spec.labels), spec.name
    assert {spec for specs in SERVICE_METRICS.values() for spec in specs} == set(CATALOGUE)


def test_endpoint_serves_metrics_and_health_and_dsec_health_follows_it() -> None:
    metrics = ProcessMetrics()
    metrics.counter(EVENTS_IN).labels("sink", "t.metrics").inc(3)
    problem: list[str] = []
    metrics.add_health_check("loop", lambda: problem[0] if problem else None)
    server = MetricsServer(metrics, "127.0.0.1", 0).start()
    health_url = f"{server.url}/healthz"
    runner = CliRunner()
    try:
        samples = scrape(server.url)
        assert value(samples, "dsec_events_in_total", service="sink", topic="t.metrics") == 3
        ok = httpx.get(f"{server.url}/healthz")
        assert ok.status_code == 200 and ok.json() == {"status": "ok", "checks": {"loop": "ok"}}
        assert runner.invoke(cli, ["health", "--url", f"{server.url}/healthz"]).exit_code == 0
        problem.append("consumer loop stopped")
        bad = httpx.get(f"{server.url}/healthz")
        assert bad.status_code == 503 and bad.json()["checks"]["loop"] == "consumer loop stopped"
        answered = runner.invoke(cli, ["health", "--url", f"{server.url}/healthz"])
        assert answered.exit_code == 1 and "consumer loop stopped" in answered.output
        assert httpx.get(f"{server.url}/nothing").status_code == 404
    finally:
        server.stop()
    refused = runner.invoke(cli, ["health", "--url", health_url])
    assert refused.exit_code == 1


def test_metrics_port_zero_turns_the_endpoint_off_and_health_says_so(monkeypatch) -> None:
    from dsec.infra.observability import serve_metrics
    from dsec.schemas.settings import DsecSettings

    monkeypatch.setenv("DSEC_METRICS_PORT", "0")
    assert serve_metrics(DsecSettings(), ProcessMetrics()) is None
    assert CliRunner().invoke(cli, ["health"]).exit_code == 1
    monkeypatch.delenv("DSEC_METRICS_PORT")
    defaults = DsecSettings()
    assert (defaults.metrics_port, defaults.metrics_host) == (9464, "127.0.0.1")
    assert defaults.health_url() == "http://127.0.0.1:9464/healthz"


def test_a_taken_port_leaves_the_service_running_without_its_endpoint(caplog) -> None:
    from dsec.infra.observability import serve_metrics
    from dsec.schemas.settings import DsecSettings

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert serve_metrics(DsecSettings(metrics_port=port), ProcessMetrics()) is None
    assert f"not served on 127.0.0.1:{port}" in caplog.text


def test_latest_values_forget_label_sets_not_updated_and_trips_age_out() -> None:
    now = [0.0]
    latest = LatestValues(GRADIENT_SYNC_SUCCESS_RATE, ttl_s=60, clock=lambda: now[0])
    latest.set(("w0",), 0.5)
    now[0] = 30.0
    latest.set_many([(("w1",), 1.0), (("w0",), 0.75)])
    now[0] = 80.0
    latest.set(("w2",), 0.25)
    assert latest.values() == {("w0",): 0.75, ("w1",): 1.0, ("w2",): 0.25}
    now[0] = 100.0
    assert latest.values() == {("w2",): 0.25}
    trips = RecentEvents(window_s=3600, clock=lambda: now[0])
    trips.add(2)
    now[0] = 3000.0
    trips.add()
    assert trips.count() == 3
    now[0] = 3701.0
    assert trips.count() == 1
    assert is_breaker_trip("bandwidth-latency-breaker", "fired")
    assert not is_breaker_trip("bandwidth-latency-breaker", "staged_up")
    assert not is_breaker_trip("meta-breaker-trips", "fired")
    assert not is_breaker_trip("periodic-snapshot", "fired")
    metrics = ProcessMetrics()
    recent = MetricSpec("dsec_test_recent_trips", "gauge", "trips in the last hour")
    metrics.gauge_function(recent, trips.count)
    assert value(_parse(metrics), "dsec_test_recent_trips") == 1
    mean = MetricSpec("dsec_test_mean_utilisation", "gauge", "mean of the latest")
    utilisation = MeanOfLatest(mean, ttl_s=60, clock=lambda: now[0])
    metrics.registry.register(utilisation)
    assert value(_parse(metrics), "dsec_test_mean_utilisation") is None  # no NaN
    utilisation.set_many([(("w0",), 0.5), (("w1",), 1.0)])
    assert value(_parse(metrics), "dsec_test_mean_utilisation") == 0.75
    pooled = LatestValues(MELT_DOWN_COUNT, ttl_s=60, clock=lambda: now[0])
    metrics.registry.register(pooled)
    pooled.set_many([(("A", "job-1"), 4.0), (("", "job-1"), 5.0)])
    assert value(_parse(metrics), "dsec_melt_down_count", pool="A", job="job-1") == 4
    assert value(_parse(metrics), "dsec_melt_down_count", pool="", job="job-1") == 5


def test_consumer_lag_from_librdkafka_statistics() -> None:
    metrics = ProcessMetrics()
    lag = ConsumerLag(metrics, "sink")

    def statistics(partitions: dict) -> str:
        import json

        return json.dumps({"topics": {"t.metrics": {"partitions": partitions}}})

    lag.on_statistics(statistics({
        "0": {"consumer_lag": 12, "fetch_state": "active"},
        "1": {"consumer_lag": 0, "fetch_state": "active"},
        "2": {"consumer_lag": -1, "fetch_state": "active"},  # nothing committed yet
        "3": {"consumer_lag": 5, "fetch_state": "none"},  # not ours
        "-1": {"consumer_lag": 7, "fetch_state": "none"},
    }))
    samples = _parse(metrics)
    assert value(samples, "dsec_consumer_lag_messages", service="sink", topic="t.metrics",
                 partition="0") == 12
    assert value(samples, "dsec_consumer_lag_messages", service="sink", topic="t.metrics",
                 partition="1") == 0
    assert len([k for k in samples if k[0] == "dsec_consumer_lag_messages"]) == 2
    lag.on_statistics(statistics({"1": {"consumer_lag": 4, "fetch_state": "active"}}))
    lag.on_statistics("not json")  # ignored
    samples = _parse(metrics)
    assert [dict(k[1])["partition"] for k in samples
            if k[0] == "dsec_consumer_lag_messages"] == ["1"]


def _parse(metrics: ProcessMetrics) -> Samples:
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(metrics.exposition().decode())
            for sample in family.samples}


# --- every service on the real broker --------------------------------------------------------

TOKEN = "metrics-test-token"










