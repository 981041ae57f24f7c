"""A platform runtime driven by a real policy, on the real broker and stack: its climbing call
latency, posted through the ingest gateway, becomes runtime features; the built-in
runtime-latency-backoff policy fires; the gateway's webhook forwarder delivers the command
to the runtime's webhook (a real HTTP server here) in both forms; the runtime's answer is
the result, stored in ClickHouse."""

from __future__ import annotations

import time
import uuid

import orjson
import pytest
from helpers import wait_for
from starlette.testclient import TestClient
from webhook_server import RecordingWebhook

from dsec.actuators.webhooks import webhook_command
from dsec.history import query
from dsec.infra.keys import verifier_for
from dsec.ingest.gateway_config import GatewayConfig
from dsec.schemas import now_ms
from dsec.services.gateway import build_gateway

pytestmark = pytest.mark.integration
TOKEN = "runtime-loop-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LATENCIES_MS = [400.0, 700.0, 1200.0, 1800.0, *[2400.0 + 100 * i for i in range(40)]]


def _rows(settings, sql: str) -> list:
    return query(settings, sql)["rows"]


def _backoffs(webhook: RecordingWebhook) -> list[bytes]:
    """The bodies posted for the latency policy (other built-in policies may post too)."""
    return [body for body in webhook.bodies
            if webhook_command(body).policy_name == "runtime-latency-backoff"]


def test_a_runtimes_climbing_latency_fires_the_policy_and_its_webhook_acknowledges(
        running_stack) -> None:
    settings = running_stack
    runtime_id = f"dify-{uuid.uuid4().hex[:6]}"
    webhook = RecordingWebhook(b'{"status": "applied", "detail": "agents accumulate 4"}')
    service = build_gateway(settings, GatewayConfig(
        token=TOKEN, webhook_allowed_networks=("127.0.0.0/8",))).start()
    try:
        client = TestClient(service.gateway.app())
        registered = client.post("/v1/runtimes", headers=AUTH, json={
            "runtime_id": runtime_id, "runtime_type": "dify", "concurrency": 16,
            "mean_call_latency_ms": LATENCIES_MS[0], "function_calling": True,
            "webhook_url": webhook.url, "job_id": settings.job_id})
        assert registered.status_code == 201, registered.text
        own = {"Authorization": f"Bearer {registered.json()['token']}"}
        for latency_ms in LATENCIES_MS:  # one report a second, until the webhook hears
            posted = client.post(f"/v1/runtimes/{runtime_id}/metrics", headers=own, json={
                "samples": [{"kind": "runtime", "event_time_ms": now_ms(),
                             "runtime_type": "dify", "concurrency": 16,
                             "mean_call_latency_ms": latency_ms, "function_calling": True}]})
            assert posted.status_code == 202, posted.text
            if _backoffs(webhook):
                break
            time.sleep(1.0)
        assert _backoffs(webhook), "the policy's command never reached the webhook"
    finally:
        service.close()
        webhook.close()

    (raw,) = _backoffs(webhook)  # once: the policy does not fire again while it holds
    body, command = orjson.loads(raw), webhook_command(raw)
    verifier_for(settings).verify(command)  # the signed form, as on the topic
    assert command.target.worker_id == runtime_id and command.action.steps == 4
    assert body["action"] == {  # the plain form
        "policy": "grad_accumulation", "steps": 4, "target": runtime_id,
        "policy_name": "runtime-latency-backoff", "actuation_id": command.actuation_id,
        "expires_at_ms": command.expires_at_ms}

    stored = wait_for(lambda: _rows(
        settings, "SELECT status, detail, worker_id FROM actuation_results WHERE "
                  f"actuation_id = '{command.actuation_id}'"), 60, what="the stored result")
    assert stored == [["applied", "agents accumulate 4", runtime_id]]
    features = dict(_rows(settings, "SELECT feature, max(value) FROM features WHERE "
                                    f"worker_id = '{runtime_id}' AND feature LIKE 'runtime_%' "
                                    "GROUP BY feature"))
    assert features["runtime_call_latency_ms"] > 2000
    assert features["runtime_concurrency"] == 16 and features["runtime_function_calling"] == 1
