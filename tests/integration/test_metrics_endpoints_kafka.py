"""Prometheus metrics and health: the catalogue, the endpoint, and every service's /metrics
scraped on the real broker after traffic (stack, sink child, node actuator, gateway)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Producer
from feature_values import HEALTHY
from helpers import start_stack, stop_stack, wait_for
from policy_broker import trace
from prometheus_client.parser import text_string_to_metric_families
from webhook_server import RecordingWebhook

from dsec.actuators.channel import Answer, Apply, Register, encode_frame, read_frame, socket_path
from dsec.bench.traces import TraceIdentity, slow_grad_sync
from dsec.infra.kafka_local import free_port
from dsec.infra.observability import METRIC_NAMES
from dsec.schemas import ActuationStatus, WorkerIdentity, encode, now_ms, topic_names
from dsec.schemas.metrics import encode_packed
from dsec.services.stack import read_stack_state

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


def exposed(samples: Samples, name: str) -> bool:
    """The family has a sample (a histogram: its ``_count``)."""
    names = {sample_name for sample_name, _ in samples}
    return name in names or f"{name}_count" in names


# --- the catalogue and the endpoint, without a broker --------------------------------------
















# --- every service on the real broker --------------------------------------------------------

TOKEN = "metrics-test-token"


class FakeWorker:
    """The worker side of the node actuator's socket: registers, answers every command
    ``applied``, and remembers what it was sent."""

    def __init__(self, run_dir: Path, identity: WorkerIdentity) -> None:
        self.applied: list[str] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(str(socket_path(run_dir, identity.node_id)))
        self._sock.sendall(encode_frame(Register(identity=identity, pid=os.getpid())))
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            while True:
                frame = read_frame(self._sock)
                if isinstance(frame, Apply):
                    self.applied.append(frame.actuation_id)
                    self._sock.sendall(encode_frame(Answer(
                        actuation_id=frame.actuation_id, status=ActuationStatus.APPLIED,
                        detail="applied by the test", replay=frame.replay)))
        except (ConnectionError, OSError):
            return

    def close(self) -> None:
        self._sock.close()


def _spawn(args: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    with log_path.open("ab") as log:
        return subprocess.Popen([sys.executable, "-m", "dsec.cli", *args], env=env,
                                stdout=log, stderr=subprocess.STDOUT)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.integration
def test_every_service_serves_its_metrics_after_traffic(kafka_bootstrap, tmp_path) -> None:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    topics = topic_names(prefix)
    stack_port = free_port(consecutive=2)  # the stack, and its sink child on the next port
    node_port, gateway_port, gateway_metrics_port = free_port(), free_port(), free_port()
    run_dir = Path(tempfile.mkdtemp(prefix="dsec-run-"))  # socket paths are short
    env = {**os.environ, "DSEC_BOOTSTRAP": kafka_bootstrap, "DSEC_TOPIC_PREFIX": prefix,
           "DSEC_KEYS_DIR": str(tmp_path / "keys"), "DSEC_DATA_DIR": str(tmp_path / "side"),
           "DSEC_RUN_DIR": str(run_dir), "DSEC_GATEWAY_TOKEN": TOKEN}
    receiver = RecordingWebhook(answer=b"")  # where the lost workers' alerts go
    stack = start_stack(kafka_bootstrap, tmp_path / "stack", prefix,
                        env={"DSEC_METRICS_PORT": str(stack_port),
                             "DSEC_ALERT_WEBHOOK_URLS": json.dumps([receiver.url]),
                             "DSEC_KEYS_DIR": str(tmp_path / "keys")})
    node = _spawn(["actuator", "--node", "node-brk"],
                  {**env, "DSEC_METRICS_PORT": str(node_port)}, tmp_path / "node.log")
    gateway = _spawn(["ingest-gateway", "--port", str(gateway_port)],
                     {**env, "DSEC_METRICS_PORT": str(gateway_metrics_port)},
                     tmp_path / "gateway.log")
    worker = None
    try:
        stack_url = f"http://127.0.0.1:{stack_port}"
        sink_url = f"http://127.0.0.1:{stack_port + 1}"
        # The sink child writes the state file; the stack adds its endpoints right after.
        wait_for(lambda: read_stack_state(tmp_path / "stack")["metrics_endpoints"] == {
            "stream-jobs": stack_url, "policy-engine": stack_url, "sink": sink_url,
            "alert-notifier": stack_url}, 30,
            what="the endpoints in the state file")
        node_url = f"http://127.0.0.1:{node_port}"
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        gateway_metrics_url = f"http://127.0.0.1:{gateway_metrics_port}"
        for url in (stack_url, sink_url, node_url, gateway_url, gateway_metrics_url):
            wait_for(lambda u=url: _healthy(u), 120, what=f"{url}/healthz")
        answered = subprocess.run(
            [sys.executable, "-m", "dsec.cli", "health"], capture_output=True, timeout=60,
            env={**os.environ, "DSEC_METRICS_PORT": str(stack_port)})
        assert answered.returncode == 0, answered.stdout + answered.stderr

        # Traffic: probe batches from three workers and one that is not JSON; feature events
        # over the breaker's latency cap for 30 s; a runtime over HTTP.
        identity = WorkerIdentity(job_id="job", worker_id="brk", node_id="node-brk")
        worker = FakeWorker(run_dir, identity)
        producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
        workers = [TraceIdentity(worker_id=f"w{i}", start_ms=now_ms() - 60_000)
                   for i in range(3)]
        batches = [b for w in workers for b in slow_grad_sync(
            w, seconds=5, latency_ms=20.0, failed_every=5, samples_dropped_per_s=7,
            recovery_time_s=2.5, utilisation_pct=90.0)]
        for batch in batches:
            producer.produce(topics.metrics, key=batch.identity.worker_id.encode(),
                             value=encode_packed(batch))
        producer.produce(topics.metrics, key=b"w0", value=b"not json")
        for event in trace({**HEALTHY, "grad_sync_latency_p95_ms": 120.0}, 30, "brk",
                           now_ms() - 40_000):
            producer.produce(topics.features, key=b"brk", value=encode(event))
        assert producer.flush(30) == 0
        auth = {"Authorization": f"Bearer {TOKEN}"}
        registered = httpx.post(f"{gateway_url}/v1/runtimes", headers=auth, json={
            "runtime_id": "dify-1", "runtime_type": "dify", "concurrency": 4,
            "mean_call_latency_ms": 800.0, "function_calling": True})
        assert registered.status_code == 201, registered.text
        runtime_auth = {"Authorization": f"Bearer {registered.json()['token']}"}
        posted = httpx.post(f"{gateway_url}/v1/runtimes/dify-1/metrics",
                            headers=runtime_auth, json={
            "samples": [{"kind": "heartbeat", "event_time_ms": now_ms(), "interval_s": 5}]})
        assert posted.status_code == 202, posted.text
        refused = httpx.post(f"{gateway_url}/v1/runtimes/dify-1/metrics",
                             headers={"Authorization": "Bearer wrong"}, json={"samples": []})
        assert refused.status_code == 401, refused.text

        # The stream jobs and the policy engine (one process).
        def stack_done() -> Samples | None:
            samples = scrape(stack_url)
            done = (
                (value(samples, "dsec_events_in_total", service="stream-jobs",
                       topic=topics.metrics) or 0) >= len(batches) + 1
                and (value(samples, "dsec_breaker_trips_total") or 0) >= 1
                and (value(samples, "dsec_workers_lost") or 0) >= 3  # heartbeats stopped
                and exposed(samples, "dsec_consumer_lag_messages")
                # the fleet job's tick after the breaker's trip and the workers' syncs
                and (value(samples, "dsec_melt_down_count", pool="", job="job") or 0) >= 1
                and value(samples, "dsec_gradient_sync_success_rate", pool="",
                          job="synthetic") is not None
                # the alert notifier announced the lost workers (Agent_<id>_lost)
                and (value(samples, "dsec_alert_notifications_total", status="firing",
                           result="delivered") or 0) >= 3
            )
            return samples if done else None

        samples = wait_for(stack_done, 90, interval_s=1, what="the stack's metrics")
        assert value(samples, "dsec_events_dead_lettered_total", service="stream-jobs",
                     reason="not_json") == 1
        assert value(samples, "dsec_events_out_total", service="stream-jobs",
                     topic=topics.dead_letters) == 1
        assert value(samples, "dsec_events_out_total", service="stream-jobs",
                     topic=topics.features) >= len(batches)
        assert value(samples, "dsec_feature_update_latency_seconds_count") >= 1
        # Per pool and job, from the fleet features (these workers have no pool: their job).
        assert value(samples, "dsec_gradient_sync_success_rate", pool="",
                     job="synthetic") == pytest.approx(0.8)
        for w in workers:
            assert value(samples, "dsec_probe_samples_dropped_total",
                         worker=w.worker_id) == 5 * 7
        assert value(samples, "dsec_snapshot_recovery_time_seconds_count") == 3
        assert value(samples, "dsec_snapshot_recovery_time_seconds_sum") == pytest.approx(7.5)
        assert value(samples, "dsec_snapshot_recovery_time_seconds_bucket", le="4.0") == 3
        assert value(samples, "dsec_sandbox_utilization_rate", pool="",
                     job="synthetic") == pytest.approx(0.9)
        assert value(samples, "dsec_events_in_total", service="policy-engine",
                     topic=topics.features) >= 6
        assert value(samples, "dsec_actuations_total", service="policy-engine",
                     action="grad_compression", result="emitted") >= 1
        assert value(samples, "dsec_events_out_total", service="policy-engine",
                     topic=topics.actuations) >= 1
        assert value(samples, "dsec_policy_evaluation_latency_seconds_count") >= 1
        lags = {dict(labels)["topic"]: v for name, labels in samples
                if name == "dsec_consumer_lag_messages"
                for v in [samples[(name, labels)]]}
        assert topics.metrics in lags and all(v >= 0 for v in lags.values())

        # The node actuator applied the breaker's first stage through the worker.
        def node_done() -> Samples | None:
            samples = scrape(node_url)
            applied = sum(v for (name, labels), v in samples.items()
                          if name == "dsec_actuations_total"
                          and ("result", "applied") in labels)
            compressed = value(samples, "dsec_actuations_total", service="node-actuator",
                               action="grad_compression", result="applied")
            return samples if compressed and applied == len(worker.applied) else None

        node_samples = wait_for(node_done, 60, interval_s=1, what="applied actuations")
        assert value(node_samples, "dsec_events_in_total", service="node-actuator",
                     topic=topics.actuations) >= 1
        assert value(node_samples, "dsec_events_out_total", service="node-actuator",
                     topic=topics.actuation_results) >= 1

        # The sink, in its own process on the next port, stored what came.
        def sink_done() -> Samples | None:
            samples = scrape(sink_url)
            stored = value(samples, "dsec_events_out_total", service="sink",
                           topic="raw_grad_sync") or 0
            return samples if stored >= len(batches) * 10 else None

        sink_samples = wait_for(sink_done, 60, interval_s=1, what="the sink's writes")
        assert value(sink_samples, "dsec_events_in_total", service="sink",
                     topic=topics.metrics) >= len(batches) + 1
        assert value(sink_samples, "dsec_events_out_total", service="sink",
                     topic="features") >= len(batches)
        wait_for(lambda: exposed(scrape(sink_url), "dsec_consumer_lag_messages"), 30,
                 what="the sink's consumer lag")
        assert not exposed(sink_samples, "dsec_sandbox_utilization_rate")  # not the sink's

        gateway_samples = scrape(gateway_url)
        assert value(gateway_samples, "dsec_events_in_total", service="ingest-gateway",
                     topic="http") == 2
        assert value(gateway_samples, "dsec_events_out_total", service="ingest-gateway",
                     topic=topics.metrics) == 2
        assert value(scrape(gateway_metrics_url), "dsec_events_in_total",
                     service="ingest-gateway", topic="http") == 2  # the same, on the metrics port
        assert value(gateway_samples, "dsec_requests_rejected_total",
                     service="ingest-gateway", reason="unauthorized") == 1

        everything = {**samples, **sink_samples, **node_samples, **gateway_samples,
                      **scrape(sink_url)}
        assert [name for name in METRIC_NAMES if not exposed(everything, name)] == []

        # A stopped service is unhealthy to `dsec health`.
        _stop(node)
        refused = subprocess.run(
            [sys.executable, "-m", "dsec.cli", "health", "--url", f"{node_url}/healthz"],
            capture_output=True, timeout=60)
        assert refused.returncode == 1
    finally:
        if worker is not None:
            worker.close()
        for process in (node, gateway):
            _stop(process)
        stop_stack(stack)
        receiver.close()
