"""The ingest gateway under hostile and clumsy clients: strict JSON, depth and size limits
while streaming, body deadlines, per-runtime tokens, webhook targets, rate limits, registry
writes off the event loop, and rejections counted by reason."""

from __future__ import annotations

import asyncio
import json

import pytest
from gateway_server import RecordingPublisher
from starlette.testclient import TestClient

from dsec.infra.runtime_registry import RuntimeRegistry
from dsec.infra.token_bucket import Bucket, TokenBuckets, refill, wait_s
from dsec.infra.webhook_targets import parse_networks, target_problem
from dsec.ingest.gateway import IngestGateway
from dsec.ingest.gateway_config import GatewayConfig
from dsec.ingest.json_body import depth_of

TOKEN = "s3cret-token"
ADMIN = "admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REGISTRATION = {
    "runtime_id": "dify-agent-7", "runtime_type": "dify", "concurrency": 16,
    "mean_call_latency_ms": 840.0, "function_calling": True, "node_id": "agent-host-1",
}
EPISODE = ('{"samples": [{"kind": "episode", "event_time_ms": 1800000000000, '
           '"episode_index": 0, "reward": %s, "length": 12}]}')


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def make_gateway(tmp_path, registry: RuntimeRegistry | None = None, **settings) -> IngestGateway:
    config = GatewayConfig(token=TOKEN, admin_token=ADMIN, **settings)
    return IngestGateway(config, registry or RuntimeRegistry(tmp_path / "runtimes.json"),
                         RecordingPublisher(), "job-a")


@pytest.fixture
def gateway(tmp_path) -> IngestGateway:
    return make_gateway(tmp_path)


def enrol(client: TestClient, runtime_id: str = "dify-agent-7") -> dict[str, str]:
    answer = client.post("/v1/runtimes", json={**REGISTRATION, "runtime_id": runtime_id},
                         headers=AUTH)
    assert answer.status_code == 201, answer.text
    return {"Authorization": f"Bearer {answer.json()['token']}"}


def rejected(gateway: IngestGateway, reason: str) -> float:
    value = gateway.metrics.registry.get_sample_value(
        "dsec_requests_rejected_total", {"service": "ingest-gateway", "reason": reason})
    return value or 0.0


# --- strict JSON ---------------------------------------------------------------------------


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_nan_infinity_and_overflow_are_refused_with_400(gateway, number) -> None:
    client = TestClient(gateway.app())
    own = enrol(client)
    published = len(gateway._publisher.published)
    answer = client.post("/v1/runtimes/dify-agent-7/metrics", content=EPISODE % number,
                         headers={**own, "content-type": "application/json"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == "invalid_json"
    assert len(gateway._publisher.published) == published
    assert rejected(gateway, "invalid_json") == 1


@pytest.mark.parametrize("depth", [40, 5000, 100_000])
def test_deeply_nested_json_is_400_not_500(gateway, depth) -> None:
    client = TestClient(gateway.app(), raise_server_exceptions=False)
    body = "[" * depth + "]" * depth
    answer = client.post("/v1/runtimes", content=body, headers=AUTH)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == "too_deep"


def test_depth_of_counts_lists_and_objects() -> None:
    assert depth_of(1) == 0 and depth_of([]) == 1 and depth_of({"a": [1, {"b": []}]}) == 4


# --- size limit while streaming, body deadline ----------------------------------------------


async def _call(app, method: str, path: str, headers: dict[str, str], receive):
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "path": path, "raw_path": path.encode(), "query_string": b"",
             "scheme": "http", "server": ("test", 80), "client": ("test", 1), "root_path": "",
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(body)


def test_a_chunked_body_is_refused_with_413_once_past_the_limit(tmp_path) -> None:
    gateway = make_gateway(tmp_path, max_body_bytes=4096)
    chunks_read = 0

    async def receive() -> dict:  # an endless chunked body, 1 KiB at a time
        nonlocal chunks_read
        chunks_read += 1
        return {"type": "http.request", "body": b" " * 1024, "more_body": True}

    status, body = asyncio.run(_call(gateway.app(), "POST", "/v1/runtimes",
                                     {**AUTH, "transfer-encoding": "chunked"}, receive))
    assert (status, body["error"]) == (413, "too_large")
    assert chunks_read == 5  # the fifth chunk passed 4 KiB; nothing more was read
    assert rejected(gateway, "too_large") == 1


def test_a_body_that_never_ends_gets_408(tmp_path) -> None:
    gateway = make_gateway(tmp_path, body_timeout_s=0.2)
    first = True

    async def receive() -> dict:  # a byte, then silence
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": b"{", "more_body": True}
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    status, body = asyncio.run(_call(gateway.app(), "POST", "/v1/runtimes", AUTH, receive))
    assert (status, body["error"]) == (408, "body_timeout")


# --- tokens --------------------------------------------------------------------------------


def test_a_runtime_token_writes_only_its_own_runtime(gateway) -> None:
    client = TestClient(gateway.app())
    own_a = enrol(client, "runtime-a")
    enrol(client, "runtime-b")
    samples = EPISODE % "1.0"
    hijack = {**REGISTRATION, "runtime_id": "runtime-b", "node_id": "attacker"}
    assert client.post("/v1/runtimes", json=hijack, headers=own_a).status_code == 403
    assert client.post("/v1/runtimes", json=hijack, headers=AUTH).status_code == 409
    assert client.post("/v1/runtimes/runtime-b/metrics", content=samples,
                       headers=own_a).status_code == 403
    assert client.post("/v1/runtimes/runtime-b/metrics", content=samples,
                       headers=AUTH).status_code == 403
    assert gateway._registry.get("runtime-b").node_id == "agent-host-1"
    assert client.post("/v1/runtimes/runtime-a/metrics", content=samples,
                       headers=own_a).status_code == 202
    assert rejected(gateway, "forbidden") == 3 and rejected(gateway, "already_registered") == 1


def test_a_revoked_token_no_longer_works_and_the_admin_issues_a_new_one(gateway) -> None:
    client = TestClient(gateway.app())
    own = enrol(client)
    samples = EPISODE % "1.0"
    assert client.delete("/v1/runtimes/dify-agent-7/token", headers=own).json()["revoked"]
    answer = client.post("/v1/runtimes/dify-agent-7/metrics", content=samples, headers=own)
    assert answer.status_code == 401
    assert client.post("/v1/runtimes/dify-agent-7/token", headers=AUTH).status_code == 403
    answer = client.post("/v1/runtimes/dify-agent-7/token",
                         headers={"Authorization": f"Bearer {ADMIN}"})
    fresh = {"Authorization": f"Bearer {answer.json()['token']}"}
    assert client.post("/v1/runtimes/dify-agent-7/metrics", content=samples,
                       headers=fresh).status_code == 202


def test_tokens_survive_a_restart_as_digests_only(tmp_path) -> None:
    gateway = make_gateway(tmp_path)
    own = enrol(TestClient(gateway.app()))
    token = own["Authorization"].removeprefix("Bearer ")
    stored = (tmp_path / "runtimes.json").read_text()
    assert token not in stored
    assert RuntimeRegistry(tmp_path / "runtimes.json").owner_of(token) == "dify-agent-7"


# --- webhook targets -----------------------------------------------------------------------


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/dsec", "http://[::1]/x",
                                 "http://169.254.169.254/latest/meta-data",
                                 "http://10.0.0.7/hook", "http://192.168.1.2/hook",
                                 "http://0.0.0.0/hook", "http://[::ffff:127.0.0.1]/hook",
                                 "http://localhost:9/dsec"])
def test_webhooks_on_loopback_link_local_and_private_targets_are_refused(gateway, url) -> None:
    client = TestClient(gateway.app())
    answer = client.post("/v1/runtimes", json={**REGISTRATION, "webhook_url": url},
                         headers=AUTH)
    assert answer.status_code == 422, answer.text
    assert [p["field"] for p in answer.json()["problems"]] == ["webhook_url"]
    assert gateway._registry.get("dify-agent-7") is None and not gateway._publisher.published


def test_an_allowed_network_admits_a_private_webhook(tmp_path) -> None:
    gateway = make_gateway(tmp_path, webhook_allowed_networks=("127.0.0.0/8",))
    client = TestClient(gateway.app())
    answer = client.post("/v1/runtimes", json={**REGISTRATION,
                                               "webhook_url": "http://127.0.0.1:9/dsec"},
                         headers=AUTH)
    assert answer.status_code == 201, answer.text


def test_target_problem_decides_on_resolved_addresses() -> None:
    assert target_problem("https://hooks.example.com/x", ["93.184.215.14"]) is None
    assert "loopback" in target_problem("https://hooks.example.com/x", ["93.184.215.14",
                                                                         "127.0.0.1"])
    assert "link-local" in target_problem("http://h/x", ["169.254.169.254"])
    assert "resolves to no address" in target_problem("http://nowhere.invalid/x", [])
    assert target_problem("http://h/x", ["10.1.2.3"], parse_networks(["10.0.0.0/8"])) is None
    assert target_problem("ftp://h/x", ["93.184.215.14"]) is not None


# --- rate limits ---------------------------------------------------------------------------


def test_token_bucket_refills_at_its_rate_up_to_its_burst() -> None:
    assert refill(Bucket(0.0, 10.0), 12.0, rate_per_s=2.0, burst=5.0) == Bucket(4.0, 12.0)
    assert refill(Bucket(4.0, 12.0), 100.0, rate_per_s=2.0, burst=5.0) == Bucket(5.0, 100.0)
    assert refill(Bucket(1.0, 12.0), 11.0, rate_per_s=2.0, burst=5.0) == Bucket(1.0, 12.0)
    assert wait_s(Bucket(0.5, 0.0), 1.0, rate_per_s=2.0) == 0.25
    assert wait_s(Bucket(1.5, 0.0), 1.0, rate_per_s=2.0) == 0.0
    clock = FakeClock()
    buckets = TokenBuckets(rate_per_s=1.0, burst=2, max_keys=2, clock=clock)
    assert [buckets.take("a") for _ in range(3)] == [0.0, 0.0, 1.0]
    clock.now_s = 1.0
    assert buckets.take("a") == 0.0
    buckets.take("b"), buckets.take("c")  # "a" is forgotten past max_keys
    assert buckets.take("a") == 0.0


def test_a_runtime_over_its_rate_gets_429_with_retry_after(tmp_path) -> None:
    clock = FakeClock()
    config = GatewayConfig(token=TOKEN, rate_per_s=0.5, rate_burst=2)
    gateway = IngestGateway(config, RuntimeRegistry(), RecordingPublisher(), "job-a",
                            rate_limits=TokenBuckets(0.5, 2, clock=clock))
    client = TestClient(gateway.app())
    own = enrol(client)
    samples = EPISODE % "1.0"
    post = lambda: client.post("/v1/runtimes/dify-agent-7/metrics", content=samples,  # noqa: E731
                               headers=own)
    assert [post().status_code for _ in range(2)] == [202, 202]
    limited = post()
    assert limited.status_code == 429 and limited.headers["retry-after"] == "2"
    assert client.post("/v1/runtimes", json={**REGISTRATION, "runtime_id": "other"},
                       headers=AUTH).status_code == 201  # other callers keep their rate
    clock.now_s = 2.0
    assert post().status_code == 202
    assert rejected(gateway, "rate_limited") == 1


# --- the registry off the event loop ----------------------------------------------------------


class ThreadNotingRegistry(RuntimeRegistry):
    def __init__(self, path) -> None:
        super().__init__(path)
        self.writes_on_a_loop: list[bool] = []

    def _write(self, text: str) -> None:
        try:
            asyncio.get_running_loop()
            self.writes_on_a_loop.append(True)
        except RuntimeError:
            self.writes_on_a_loop.append(False)
        super()._write(text)


def test_the_registry_file_is_written_off_the_event_loop(tmp_path) -> None:
    registry = ThreadNotingRegistry(tmp_path / "runtimes.json")
    client = TestClient(make_gateway(tmp_path, registry=registry).app())
    own = enrol(client)
    assert client.post("/v1/runtimes", json=REGISTRATION, headers=own).status_code == 200
    assert registry.writes_on_a_loop == [False, False]
    assert RuntimeRegistry(tmp_path / "runtimes.json").get("dify-agent-7") is not None


def test_registry_changes_reach_the_file_on_flush_only(tmp_path) -> None:
    from dsec.schemas import RuntimeRegistration

    registry = RuntimeRegistry(tmp_path / "runtimes.json")
    registry.put(RuntimeRegistration.model_validate(REGISTRATION))
    assert not (tmp_path / "runtimes.json").exists()
    registry.flush()
    written = (tmp_path / "runtimes.json").stat().st_mtime_ns
    registry.flush()  # nothing changed: nothing written
    assert (tmp_path / "runtimes.json").stat().st_mtime_ns == written
