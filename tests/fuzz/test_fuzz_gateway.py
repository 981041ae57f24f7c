"""The ingest gateway's JSON bodies, fuzzed: the strict parser and the models refuse with
the field named, and the HTTP app answers every body with a documented status (never a
500), publishing only what it accepted."""

from __future__ import annotations

import pytest
from fuzzing import fuzz
from gateway_server import RecordingPublisher
from hypothesis import given
from starlette.testclient import TestClient

from dsec.bench.fuzz_inputs import gateway_bodies
from dsec.bench.fuzz_targets import gateway_body
from dsec.infra.runtime_registry import RuntimeRegistry
from dsec.ingest.gateway import IngestGateway
from dsec.ingest.gateway_config import GatewayConfig
from dsec.schemas import DecodeError
from dsec.schemas.fast_decode import decode_metric_batch

TOKEN = "fuzz-token"
RUNTIME = {"runtime_id": "fuzzed", "runtime_type": "dify", "concurrency": 1,
           "mean_call_latency_ms": 1.0, "function_calling": False}
# What each route may answer; 409: the registration's runtime id is taken.
ANSWERS = {"/v1/runtimes": {201, 400, 409, 413, 422},
           "/v1/runtimes/fuzzed/metrics": {202, 400, 413, 422}}


@pytest.fixture(scope="module")
def gateway() -> tuple[TestClient, RecordingPublisher, dict[str, str]]:
    publisher = RecordingPublisher()
    config = GatewayConfig(token=TOKEN, rate_per_s=1e6, rate_burst=1_000_000,
                           max_body_bytes=64 * 1024)
    app = IngestGateway(config, RuntimeRegistry(), publisher, "job").app()
    client = TestClient(app, raise_server_exceptions=False)
    answer = client.post("/v1/runtimes", json=RUNTIME,
                         headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 201, answer.text
    return client, publisher, {"Authorization": f"Bearer {answer.json()['token']}"}


@fuzz(250)
@given(gateway_bodies())
def test_bodies_are_strict_json_within_the_depth_or_refused_naming_the_field(data) -> None:
    gateway_body(data)


@fuzz(150)
@given(gateway_bodies())
def test_every_body_gets_a_documented_answer_and_only_accepted_ones_are_published(
        gateway, data: bytes) -> None:
    client, publisher, own = gateway
    for path, auth in (("/v1/runtimes", {"Authorization": f"Bearer {TOKEN}"}),
                       ("/v1/runtimes/fuzzed/metrics", own)):
        published = len(publisher.published)
        answer = client.post(path, content=data,
                             headers={**auth, "content-type": "application/json"})
        assert answer.status_code in ANSWERS[path], (path, answer.status_code, answer.text)
        body = answer.json()
        if answer.status_code >= 400:
            assert body["error"] and body["detail"]
            assert len(publisher.published) == published
        if answer.status_code == 422:
            assert all(problem["field"] for problem in body.get("problems", [{"field": "-"}]))
        if answer.status_code in (201, 202):
            for _key, value in publisher.published[published:]:
                try:
                    decode_metric_batch(value)
                except DecodeError as exc:  # what the gateway accepts, the pipeline takes
                    pytest.fail(f"published a batch the pipeline refuses: {exc.reason}")
