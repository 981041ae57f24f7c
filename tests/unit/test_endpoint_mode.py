"""Endpoint mode: the probe publishes through the real ingest gateway (its publisher
recording what would go to Kafka) with the Kafka transport's guarantees: every sample
sent, dropped or buffered, and counted; nothing blocks the training thread."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

import orjson
import pytest
from gateway_server import RecordingPublisher, serving
from helpers import wait_for

import dsec
from dsec.infra.kafka_local import free_port
from dsec.ingest import ProbeConfig
from dsec.ingest.gateway_client import GatewayClient, Outcome
from dsec.ingest.gateway_config import GatewayConfig
from dsec.ingest.http_transport import HttpTransport, HttpTransportConfig
from dsec.schemas import RuntimeRegistration
from dsec.schemas.settings import DsecSettings

TOKEN = "enrolment-token"


@pytest.fixture(autouse=True)
def _no_probe_left_running() -> Iterator[None]:
    yield
    dsec.shutdown()


@pytest.fixture
def settings(tmp_path) -> DsecSettings:
    return DsecSettings(job_id="job-e", data_dir=tmp_path / "dsec", run_dir=tmp_path / "run")


def _fast(**overrides) -> ProbeConfig:
    return ProbeConfig(flush_interval_s=0.05, grad_sync_timing=False, cuda_memory_interval_s=0,
                       gpu_sample_interval_s=0, step_sample_every_n_steps=1, **overrides)


def _train(steps: int, episodes: int) -> None:
    for step in range(steps):
        dsec.report_step(1.0 / (step + 1))
    for episode in range(episodes):
        dsec.report_episode_end(float(episode), 10 + episode)


def _rows(publisher: RecordingPublisher, worker_id: str) -> list:
    return [row for batch in publisher.batches() if batch.identity.worker_id == worker_id
            for row in batch.rows()]


def test_init_with_an_endpoint_publishes_through_the_gateway(settings) -> None:
    publisher = RecordingPublisher()
    with serving(GatewayConfig(token=TOKEN), publisher, job_id="gateway-job") as gateway:
        runtime = dsec.init(worker_id="rank-3", node_id="node-a", settings=settings,
                            probe_config=_fast(), endpoint=gateway.url,
                            endpoint_token=TOKEN)
        assert runtime.actuator is None  # no Kafka consumer: the worker cannot reach Kafka
        _train(steps=50, episodes=7)
        counters = dsec.shutdown()
    assert counters is not None
    assert counters.samples_dropped == 0 and counters.samples_buffered == 0
    assert counters.samples_sent == counters.samples_recorded
    rows = _rows(publisher, "rank-3")
    kinds = Counter(row.kind for row in rows)
    assert kinds["step"] == 50 and kinds["episode"] == 7 and kinds["runtime"] == 1
    assert len(rows) - kinds["runtime"] == counters.samples_sent
    identities = {batch.identity for batch in publisher.batches()}
    assert {(i.job_id, i.node_id) for i in identities} == {("job-e", "node-a")}


def test_the_gateway_restarted_without_its_registry_loses_nothing(settings) -> None:
    """Its registry gone, the gateway answers 404: the probe registers again, and what it
    buffered meanwhile arrives, in order."""
    port = free_port()
    first, second = RecordingPublisher(), RecordingPublisher()
    config = GatewayConfig(token=TOKEN, port=port)
    with serving(config, first) as gateway:
        dsec.init(worker_id="w-restart", settings=settings, probe_config=_fast(),
                  endpoint=gateway.url, endpoint_token=TOKEN, actuate=False)
        dsec.report_episode_end(1.0, 1)
        wait_for(lambda: dsec.current().probe.counters().samples_sent >= 1, 10,
                 what="the first episode sent")
    dsec.report_episode_end(2.0, 2)  # the gateway is away: kept
    with serving(config, second):
        dsec.report_episode_end(3.0, 3)
        counters = dsec.shutdown()
    assert counters is not None and counters.samples_dropped == 0
    rewards = [row.reward for publisher in (first, second)
               for row in _rows(publisher, "w-restart") if row.kind == "episode"]
    assert rewards == [1.0, 2.0, 3.0]
    assert [r.kind for r in _rows(second, "w-restart")].count("runtime") == 1  # again


def test_a_gateway_away_costs_samples_not_step_time(settings) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    dsec.init(worker_id="w-away", settings=settings, endpoint=closed, endpoint_token=TOKEN,
              probe_config=_fast(buffer_max_samples=500, message_timeout_s=0.5,
                                 shutdown_flush_timeout_s=1.0))
    started = time.perf_counter()
    _train(steps=20_000, episodes=0)
    per_step_us = (time.perf_counter() - started) / 20_000 * 1e6
    time.sleep(1.0)  # the messages out for sending time out
    counters = dsec.shutdown()
    assert counters is not None
    assert counters.samples_sent == 0 and counters.samples_dropped >= 20_000 - 500
    assert counters.samples_recorded == (counters.samples_sent + counters.samples_buffered
                                         + counters.samples_dropped)
    assert per_step_us < 1000  # a report costs microseconds; a request would cost more


def test_a_worker_restarting_with_its_runtime_token_reports_again() -> None:
    """The enrolment token registers a new worker only; a restart presents its own token."""
    publisher = RecordingPublisher()
    registration = RuntimeRegistration(runtime_id="w-own", runtime_type="dsec-probe",
                                       concurrency=1, mean_call_latency_ms=0,
                                       function_calling=False)
    with serving(GatewayConfig(token=TOKEN), publisher) as gateway:
        first = GatewayClient(gateway.url, TOKEN, registration, timeout_s=5)
        assert first.post_batch(b'{"samples": []}').outcome is Outcome.REFUSED  # registered
        runtime_token = first._token
        again = GatewayClient(gateway.url, TOKEN, registration, timeout_s=5)
        refused = again.post_batch(b'{"samples": []}')
        assert refused.outcome is Outcome.RETRY and "runtime token" in refused.detail
        restarted = GatewayClient(gateway.url, runtime_token, registration, timeout_s=5)
        body = orjson.dumps({"batch_id": "0123456789abcdef", "columns": {"heartbeat": {
            "event_time_ms": [1_800_000_000_000], "interval_s": [5.0]}}})
        assert restarted.post_batch(body).outcome is Outcome.SENT
        for client in (first, again, restarted):
            client.close()


def test_a_batch_the_gateway_refuses_is_lost_at_once_and_the_next_goes_on() -> None:
    publisher = RecordingPublisher()
    registration = RuntimeRegistration(runtime_id="w-bad", runtime_type="dsec-probe",
                                       concurrency=1, mean_call_latency_ms=0,
                                       function_calling=False)
    reports: list[tuple[bool, str]] = []
    with serving(GatewayConfig(token=TOKEN), publisher) as gateway:
        transport = HttpTransport(GatewayClient(gateway.url, TOKEN, registration, 5), "m",
                                  HttpTransportConfig(message_timeout_s=10))
        bad = orjson.dumps({"event_id": "0123456789abcdef", "columns": {"step": {
            "event_time_ms": [1], "step": [-1]}}})
        good = orjson.dumps({"event_id": "0123456789abcdf0", "columns": {"heartbeat": {
            "event_time_ms": [1_800_000_000_000], "interval_s": [5.0]}}})
        for value in (bad, good):
            assert transport.send("m", b"w-bad", value, lambda ok, why: reports.append((ok, why)))
        transport.send("results", b"w-bad", good, lambda ok, why: reports.append((ok, why)))
        assert transport.flush(10) == 0
        transport.close()
    assert [ok for ok, _ in reports] == [False, False, True]  # the results one at once
    assert "metrics only" in reports[0][1] and "HTTP 422" in reports[1][1]
    assert [b.event_id for b in publisher.batches() if b.columns is not None] != []


def test_endpoint_mode_needs_a_token_and_a_url(settings) -> None:
    with pytest.raises(ValueError, match="DSEC_ENDPOINT_TOKEN"):
        dsec.init(worker_id="w", settings=settings, endpoint="http://127.0.0.1:9")
    with pytest.raises(ValueError, match="http"):
        dsec.init(worker_id="w", settings=settings, endpoint="kafka:9092",
                  endpoint_token=TOKEN)


def test_a_worker_in_endpoint_mode_keeps_its_pool_and_labels(settings) -> None:
    publisher = RecordingPublisher()
    with serving(GatewayConfig(token=TOKEN), publisher, job_id="gateway-job") as gateway:
        dsec.init(worker_id="rank-4", node_id="node-a", settings=settings, pool="a100-pool",
                  labels={"rack": "r7"}, probe_config=_fast(), endpoint=gateway.url,
                  endpoint_token=TOKEN)
        _train(steps=5, episodes=1)
        dsec.shutdown()
    identities = {batch.identity for batch in publisher.batches()}
    assert {(i.pool, tuple(i.labels.items())) for i in identities} == {
        ("a100-pool", (("rack", "r7"),))}
