"""The HTTP ingest gateway: auth, validation errors naming the field, publication on the real
broker, and webhook delivery of actuations."""

from __future__ import annotations

import uuid

import pytest
from gateway_server import RecordingPublisher
from keys import FORGER, KEYRING, VERIFIER
from starlette.testclient import TestClient

from dsec.actuators.webhooks import WebhookForwarder, answer_status
from dsec.infra.runtime_registry import RuntimeRegistry
from dsec.ingest.gateway import IngestGateway
from dsec.ingest.gateway_config import GatewayConfig
from dsec.schemas import (
    ActuationCommand,
    ActuationResult,
    ActuationStatus,
    MetricBatch,
    Signer,
    WorkerIdentity,
    decode,
    encode,
    now_ms,
)
from dsec.schemas.actuations import SnapshotParams

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REGISTRATION = {
    "runtime_id": "dify-agent-7", "runtime_type": "dify", "concurrency": 16,
    "mean_call_latency_ms": 840.0, "function_calling": True,
    "webhook_url": "http://127.0.0.1:9/dsec", "node_id": "agent-host-1",
}
GOOD_SAMPLES = {"samples": [
    {"kind": "episode", "event_time_ms": 1_800_000_000_000, "episode_index": 0,
     "reward": 3.5, "length": 12, "termination_reason": "tool_call_timeout"},
    {"kind": "heartbeat", "event_time_ms": 1_800_000_000_001, "interval_s": 5},
]}


@pytest.fixture
def gateway(tmp_path) -> tuple[TestClient, RecordingPublisher, RuntimeRegistry]:
    publisher = RecordingPublisher()
    registry = RuntimeRegistry(tmp_path / "runtimes.json")
    config = GatewayConfig(token=TOKEN, webhook_allowed_networks=("127.0.0.0/8",))
    app = IngestGateway(config, registry, publisher, "job-a").app()
    return TestClient(app), publisher, registry


def test_registration_is_published_and_remembered(gateway, tmp_path) -> None:
    client, publisher, _registry = gateway
    answer = client.post("/v1/runtimes", json=REGISTRATION, headers=AUTH)
    assert answer.status_code == 201, answer.text
    own = {"Authorization": f"Bearer {answer.json()['token']}"}
    assert client.post("/v1/runtimes", json=REGISTRATION, headers=own).status_code == 200
    key, value = publisher.published[0]
    batch = decode(value, MetricBatch)
    assert key == b"dify-agent-7" and batch.identity.job_id == "job-a"
    (sample,) = batch.samples
    assert (sample.kind, sample.concurrency, sample.function_calling) == ("runtime", 16, True)
    assert RuntimeRegistry(tmp_path / "runtimes.json").get("dify-agent-7") is not None
    shown = client.get("/v1/runtimes/dify-agent-7", headers=AUTH).json()
    assert shown["webhook_url"] == "http://127.0.0.1:9/dsec"


def enrol(client: TestClient, registration: dict = REGISTRATION) -> dict[str, str]:
    """Registers with the enrolment token; the runtime's own token as headers."""
    answer = client.post("/v1/runtimes", json=registration, headers=AUTH)
    assert answer.status_code == 201, answer.text
    return {"Authorization": f"Bearer {answer.json()['token']}"}


def test_metrics_become_one_batch_with_the_registered_identity(gateway) -> None:
    client, publisher, _ = gateway
    own = enrol(client)
    answer = client.post("/v1/runtimes/dify-agent-7/metrics", json=GOOD_SAMPLES, headers=own)
    assert answer.status_code == 202 and answer.json()["accepted"] == 2
    batch = decode(publisher.published[-1][1], MetricBatch)
    assert batch.identity == WorkerIdentity(job_id="job-a", worker_id="dify-agent-7",
                                            node_id="agent-host-1")
    assert [s.kind for s in batch.samples] == ["episode", "heartbeat"]


COLUMNS = {"step": {"event_time_ms": [1_800_000_000_000, 1_800_000_000_010],
                    "step": [0, 1], "loss": [0.5, None], "loss_nonfinite": [False, True]},
           "heartbeat": {"event_time_ms": [1_800_000_000_020], "interval_s": [5.0]}}


def test_columns_and_a_batch_id_make_one_message_id_per_runtime_and_batch(gateway) -> None:
    """The probes' form: columns, named by the probe, so that a batch posted twice (an
    answer lost on the way back) is one message id downstream."""
    client, publisher, _ = gateway
    own = enrol(client)
    body = {"batch_id": "3f2a9c1d00000001", "columns": COLUMNS}
    answers = [client.post("/v1/runtimes/dify-agent-7/metrics", json=body, headers=own)
               for _ in range(2)]
    assert [a.status_code for a in answers] == [202, 202]
    assert answers[0].json() == answers[1].json()
    assert answers[0].json()["accepted"] == 3
    first, second = (decode(value, MetricBatch) for _key, value in publisher.published[-2:])
    assert first.event_id == second.event_id == answers[0].json()["batch_id"]
    assert [(r.kind, r.loss_nonfinite) for r in first.rows() if r.kind == "step"] == [
        ("step", False), ("step", True)]
    other = enrol(client, {**REGISTRATION, "runtime_id": "other-agent"})
    theirs = client.post("/v1/runtimes/other-agent/metrics", json=body, headers=other)
    assert theirs.json()["batch_id"] != answers[0].json()["batch_id"]  # never another's id
    unnamed = client.post("/v1/runtimes/dify-agent-7/metrics", json={"columns": COLUMNS},
                          headers=own)
    assert unnamed.json()["batch_id"] != answers[0].json()["batch_id"]


def test_a_post_with_neither_rows_nor_columns_is_refused(gateway) -> None:
    client, publisher, _ = gateway
    own = enrol(client)
    published_before = len(publisher.published)
    for body in ({}, {"columns": {}}, {"batch_id": "3f2a9c1d00000001"}):
        answer = client.post("/v1/runtimes/dify-agent-7/metrics", json=body, headers=own)
        assert answer.status_code == 422, body
        assert [p["field"] for p in answer.json()["problems"]] == ["samples"]
    assert len(publisher.published) == published_before


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": f"Basic {TOKEN}"}])
def test_bad_or_missing_token_is_401(gateway, headers) -> None:
    client, publisher, _ = gateway
    answer = client.post("/v1/runtimes", json=REGISTRATION, headers=headers)
    assert answer.status_code == 401
    assert answer.json()["error"] == "unauthorized" and "token" in answer.json()["detail"]
    assert answer.headers["www-authenticate"] == "Bearer"
    assert publisher.published == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"samples": [{"kind": "episode", "event_time_ms": 1, "episode_index": 0,
                       "reward": "lots", "length": 3}]}, "samples.0.episode.reward"),
        ({"samples": [{"kind": "bogus", "event_time_ms": 1}]}, "samples.0"),
        ({"samples": []}, "samples"),
        ({"samples": [{"kind": "heartbeat", "event_time_ms": 1, "interval_s": 5,
                       "extra": 1}]}, "samples.0.heartbeat.extra"),
    ],
)
def test_malformed_batch_is_422_naming_the_field(gateway, body, field) -> None:
    client, publisher, _ = gateway
    own = enrol(client)
    published_before = len(publisher.published)
    answer = client.post("/v1/runtimes/dify-agent-7/metrics", json=body, headers=own)
    assert answer.status_code == 422, answer.text
    payload = answer.json()
    assert payload["error"] == "invalid_request"
    assert field in [p["field"] for p in payload["problems"]]
    assert field in payload["detail"] or payload["problems"][0]["field"] in payload["detail"]
    assert len(publisher.published) == published_before


def test_other_client_errors_say_what_is_wrong(gateway) -> None:
    client, publisher, _ = gateway
    answer = client.post("/v1/runtimes/nobody/metrics", json=GOOD_SAMPLES, headers=AUTH)
    assert answer.status_code == 404 and "POST /v1/runtimes" in answer.json()["detail"]
    answer = client.post("/v1/runtimes", content=b"{not json", headers=AUTH)
    assert answer.status_code == 400 and answer.json()["error"] == "invalid_json"
    bad = {**REGISTRATION, "concurrency": 0, "webhook_url": "not a url"}
    answer = client.post("/v1/runtimes", json=bad, headers=AUTH)
    assert {p["field"] for p in answer.json()["problems"]} == {"concurrency", "webhook_url"}
    own = enrol(client)
    publisher.failing = True
    answer = client.post("/v1/runtimes/dify-agent-7/metrics", json=GOOD_SAMPLES, headers=own)
    assert answer.status_code == 503 and "try again" in answer.json()["detail"]


def _command(worker_id: str, signer: Signer, job_id: str = "job-a") -> ActuationCommand:
    now = now_ms()
    return signer.sign(ActuationCommand(
        actuation_id=uuid.uuid4().hex, event_time_ms=now, expires_at_ms=now + 60_000,
        target=WorkerIdentity(job_id=job_id, worker_id=worker_id, node_id="agent-host-1"),
        policy_name="reward-variance-jump", policy_version=1, action=SnapshotParams(),
    ))


def test_webhook_forwarder_delivers_checks_and_reports(tmp_path) -> None:
    from dsec.schemas import RuntimeRegistration

    registry = RuntimeRegistry()
    registry.put(RuntimeRegistration.model_validate(REGISTRATION))
    posted: list[tuple[str, bytes]] = []
    results: list[ActuationResult] = []

    def post(url: str, body: bytes, _timeout_s: float) -> tuple[int, bytes]:
        posted.append((url, body))
        return 200, b'{"status": "applied", "detail": "snapshot queued"}'

    forwarder = WebhookForwarder(
        registry, "job-a", {}, "actuations", "results", VERIFIER,
        lambda _topic, _key, value: results.append(decode(value, ActuationResult)), 5.0, post,
    )
    command = _command("dify-agent-7", KEYRING)
    assert forwarder.handle(encode(command)) is ActuationStatus.APPLIED
    assert forwarder.handle(encode(command)) is None  # duplicate: once only
    assert forwarder.handle(encode(_command("someone-else", KEYRING))) is None
    assert forwarder.handle(encode(_command("dify-agent-7", FORGER))) is (
        ActuationStatus.REJECTED)
    assert len(posted) == 1 and decode(posted[0][1], ActuationCommand) == command
    assert results[0].detail == "snapshot queued" and results[0].identity.worker_id == (
        "dify-agent-7")
    assert answer_status(500, b"") == (ActuationStatus.FAILED, "webhook answered HTTP 500")
    assert answer_status(204, b"")[0] is ActuationStatus.APPLIED






