"""dsec survives all of issue 24 at once, on the real broker: a running stack, the ingest
gateway over TLS and a node actuator take a burst of every class of poison input found
(and a few hundred fuzzed messages and bodies) beside a well-behaved worker and a
well-behaved runtime. Afterwards every service answers /healthz 200, everything the two
sent is stored (sent = stored), and every message of theirs has its features.

The gateway's own refusals are checked on the way: NaN, nesting, size, tokens, webhook
targets and its rate limit, each with its status and counted by reason."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import httpx
import pytest
from fuzzing import drawn
from helpers import wait_for
from hostile_inputs import (
    DAY_MS,
    dated,
    episodes,
    healthy,
    huge_rewards,
    infinite_packed_reward,
    nested_lists,
    publish,
    rows,
    start_serving_stack,
)
from keys import FORGER

from dsec.bench.fuzz_inputs import (
    command_documents,
    feature_event_documents,
    gateway_bodies,
    metric_batches,
    policies,
    result_documents,
    wire,
)
from dsec.infra.kafka_local import free_port
from dsec.infra.keys import signer_for, signing_env
from dsec.schemas import (
    ActuationCommand,
    PolicySpec,
    Signer,
    WorkerIdentity,
    encode,
    now_ms,
    topic_names,
)
from dsec.schemas.actuations import SnapshotParams
from dsec.schemas.trust import KeyRole
from dsec.services.stack import stop_process

pytestmark = pytest.mark.integration
TOKEN = "burst-token"
STEADY_BATCHES = 40
RUNTIME_POSTS = 10
NODE = "node-burst"
MAX_BODY_BYTES = 64 * 1024  # the gateway's limit in this test


def _self_signed(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def _spawn(args: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    with log_path.open("ab") as log:
        return subprocess.Popen([sys.executable, "-m", "dsec.cli", *args], env=env,
                                stdout=log, stderr=subprocess.STDOUT)


def _hostile_metrics() -> list[tuple[bytes, bytes | None]]:
    """A sample of each poison metric batch of the issue, a tombstone, bytes that are not
    JSON, and fuzzed batches, keyed to workers of their own."""
    twice = episodes("hostile-twice", 0)
    named = [nested_lists("hostile-nested", ragged=True),
             nested_lists("hostile-nested", ragged=False),
             huge_rewards("hostile-huge"), infinite_packed_reward("hostile-inf"),
             dated("hostile-1970", 0, rows=False), dated("hostile-1970", 0, rows=True),
             dated("hostile-ahead", now_ms() + 365 * DAY_MS, rows=True), twice, twice,
             b"not json", None]
    fuzzed = drawn(metric_batches(), 200)
    return [(b"hostile", value) for value in [*named, *fuzzed]]


def _hostile_policies(key: Signer) -> list[tuple[bytes, bytes | None]]:
    def policy(name: str, **changes: object) -> tuple[bytes, bytes]:
        spec = PolicySpec.model_validate({
            "name": name, "condition": "gpu_temperature_c > 90.0", "cooldown_s": 0,
            "selector": {"job_ids": ["hostile-job"]},
            "action": {"params": {"kind": "snapshot"}}, **changes})
        return name.encode(), encode(key.sign(spec))

    return [policy("hostile-deep", condition="(" * 150 + "reward_mean > 1.0" + ")" * 150),
            policy("hostile-unknown", condition="not_a_feature > 1.0"),
            policy("hostile-function", condition="undefined_fn(reward_mean) > 1.0"),
            policy("hostile-every-time", condition="heartbeat_age_s >= 0.0"),
            (b"periodic-snapshot", None),  # an unsigned tombstone of a built-in
            *[(b"hostile-fuzz", value) for value in drawn(policies(), 40)]]


def _hostile_commands(key: Signer) -> list[tuple[bytes, bytes]]:
    at = now_ms()
    target = WorkerIdentity(job_id="hostile-job", worker_id="hostile-w", node_id=NODE)
    genuine = key.sign(ActuationCommand(actuation_id=uuid.uuid4().hex, event_time_ms=at,
                                    expires_at_ms=at + 60_000, target=target,
                                    policy_name="hostile", policy_version=1,
                                    action=SnapshotParams()))
    ahead = key.sign(genuine.model_copy(update={
        "actuation_id": uuid.uuid4().hex, "event_time_ms": at + 365 * DAY_MS,
        "expires_at_ms": at + 365 * DAY_MS + 60_000, "signature": None}))
    forged = [FORGER.sign(genuine.model_copy(update={"signature": None}))] * 20
    fuzzed = drawn(wire(command_documents()), 80)
    return [(NODE.encode(), value) for value in
            [*map(encode, [*forged, genuine, ahead]), *fuzzed]]


def _gateway_refusals(base: str, verify: ssl.SSLContext, own: dict[str, str]) -> None:
    """The gateway's answers to a hostile client, each with its status."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    post = f"{base}/v1/runtimes/hostile-runtime/metrics"
    sample = '{"samples": [{"kind": "episode", "event_time_ms": %d, "episode_index": 0, ' \
             '"reward": %s, "length": 3}]}'
    with httpx.Client(verify=verify, timeout=30) as client:
        for number, status in (("NaN", 400), ("Infinity", 400), ("1e400", 400),
                               ("1e308", 202)):
            answer = client.post(post, content=sample % (now_ms(), number),
                                 headers={**own, "content-type": "application/json"})
            assert answer.status_code == status, (number, answer.text)
        assert client.post(post, content="[" * 5000 + "]" * 5000,
                           headers=own).status_code == 400
        assert client.post(post, content=b"{" + b" " * MAX_BODY_BYTES + b"}",
                           headers=own).status_code == 413
        assert client.post(post, json={"samples": []},
                           headers={"Authorization": "Bearer wrong"}).status_code == 401
        other = client.post(f"{base}/v1/runtimes/steady-runtime/metrics", headers=own,
                            json={"samples": [{"kind": "heartbeat", "event_time_ms": now_ms(),
                                               "interval_s": 5}]})
        assert other.status_code == 403, other.text
        loopback = client.post(f"{base}/v1/runtimes", headers=auth, json={
            "runtime_id": "hostile-webhook", "runtime_type": "x", "concurrency": 1,
            "mean_call_latency_ms": 1.0, "function_calling": False,
            "webhook_url": "http://169.254.169.254/latest/meta-data"})
        assert loopback.status_code == 422, loopback.text
        for body in drawn(gateway_bodies(), 60):
            answer = client.post(post, content=body,
                                 headers={**own, "content-type": "application/json"})
            assert answer.status_code in (202, 400, 413, 422, 429), answer.text
        limited = [client.post(post, headers=own, json={"samples": [
            {"kind": "heartbeat", "event_time_ms": now_ms(), "interval_s": 5}]})
            for _ in range(60)]
        over = [answer for answer in limited if answer.status_code == 429]
        assert over and all(int(answer.headers["retry-after"]) >= 1 for answer in over)


def test_every_service_survives_a_burst_of_hostile_inputs(kafka_bootstrap, tmp_path) -> None:
    stack = start_serving_stack(kafka_bootstrap, tmp_path / "stack")
    settings = stack.settings
    topics = topic_names(settings.topic_prefix)
    key = signer_for(settings, KeyRole.COMMAND_SIGNER, also=[KeyRole.POLICY_PUBLISHER])
    cert, cert_key = _self_signed(tmp_path)
    run_dir = Path(tempfile.mkdtemp(prefix="dsec-burst-"))  # socket paths are short
    gateway_port, gateway_metrics, node_port = free_port(), free_port(), free_port()
    env = {**os.environ, "DSEC_BOOTSTRAP": kafka_bootstrap,
           "DSEC_TOPIC_PREFIX": settings.topic_prefix, **signing_env(settings),
           "DSEC_DATA_DIR": str(tmp_path / "side"), "DSEC_RUN_DIR": str(run_dir),
           "DSEC_GATEWAY_TOKEN": TOKEN, "DSEC_JOB_ID": "test-job",
           "DSEC_GATEWAY_MAX_BODY_BYTES": str(MAX_BODY_BYTES)}
    gateway = _spawn(["ingest-gateway", "--port", str(gateway_port), "--tls-certfile",
                      str(cert), "--tls-keyfile", str(cert_key)],
                     {**env, "DSEC_METRICS_PORT": str(gateway_metrics)},
                     tmp_path / "gateway.log")
    node = _spawn(["actuator", "--node", NODE], {**env, "DSEC_METRICS_PORT": str(node_port)},
                  tmp_path / "node.log")
    base = f"https://127.0.0.1:{gateway_port}"
    verify = ssl.create_default_context(cafile=str(cert))
    urls = {**stack.urls, "gateway-metrics": f"http://127.0.0.1:{gateway_metrics}",
            "node-actuator": f"http://127.0.0.1:{node_port}"}
    idle: list[socket.socket] = []
    try:
        for url in urls.values():
            wait_for(lambda u=url: healthy(u), 120, what=f"{url}/healthz")
        wait_for(lambda: _https_healthy(base, verify), 60, what="the gateway over TLS")
        with pytest.raises(httpx.TransportError):  # TLS only
            httpx.get(f"http://127.0.0.1:{gateway_port}/healthz", timeout=5)

        with httpx.Client(verify=verify, timeout=30) as client:
            tokens = {}
            for runtime in ("steady-runtime", "hostile-runtime"):
                registered = client.post(f"{base}/v1/runtimes",
                                         headers={"Authorization": f"Bearer {TOKEN}"}, json={
                    "runtime_id": runtime, "runtime_type": "dify", "concurrency": 2,
                    "mean_call_latency_ms": 100.0, "function_calling": True})
                assert registered.status_code == 201, registered.text
                tokens[runtime] = {"Authorization": f"Bearer {registered.json()['token']}"}
        # Connections that never send a request: the gateway closes them and serves others.
        idle = [verify.wrap_socket(socket.create_connection(("127.0.0.1", gateway_port)),
                                   server_hostname="127.0.0.1") for _ in range(50)]

        steady = [(b"steady", episodes("steady", i)) for i in range(STEADY_BATCHES)]
        hostile = _hostile_metrics()
        interleaved = [message for pair in zip(steady, hostile[:STEADY_BATCHES], strict=True)
                       for message in pair] + hostile[STEADY_BATCHES:]
        publish(settings, topics.metrics, interleaved)
        publish(settings, topics.policies, _hostile_policies(key))
        publish(settings, topics.actuations, _hostile_commands(key))
        publish(settings, topics.features, [(b"hostile", value) for value in
                                            drawn(wire(feature_event_documents()), 80)])
        publish(settings, topics.actuation_results, [(b"hostile", value) for value in
                                                     drawn(wire(result_documents()), 40)])
        _gateway_refusals(base, verify, tokens["hostile-runtime"])
        with httpx.Client(verify=verify, timeout=30) as client:
            for i in range(RUNTIME_POSTS):
                posted = client.post(f"{base}/v1/runtimes/steady-runtime/metrics",
                                     headers=tokens["steady-runtime"], json={"samples": [
                        {"kind": "episode", "event_time_ms": now_ms() - 1000 + i,
                         "episode_index": i, "reward": 1.0, "length": 10}]})
                assert posted.status_code == 202, posted.text

        def stored(worker: str, feature_events: int, samples: int) -> bool:
            counted = rows(settings, f"""
                SELECT (SELECT count() FROM raw_episode WHERE worker_id = '{worker}'),
                       (SELECT uniqExact(event_id) FROM features WHERE worker_id = '{worker}'
                        AND feature = 'episodes_total')""")[0]
            return counted == [samples, feature_events]

        wait_for(lambda: stored("steady", STEADY_BATCHES, 3 * STEADY_BATCHES), 240,
                 interval_s=2, what="every batch of the steady worker stored, with features")
        wait_for(lambda: stored("steady-runtime", RUNTIME_POSTS, RUNTIME_POSTS), 120,
                 interval_s=2, what="every post of the steady runtime stored, with features")
        assert {url: healthy(url) for url in urls.values()} == dict.fromkeys(urls.values(), True)
        assert _https_healthy(base, verify)
        rejected = httpx.get(f"{base}/metrics", verify=verify, timeout=10).text
        for reason in ("invalid_json", "too_deep", "too_large", "unauthorized", "forbidden",
                       "invalid_request", "rate_limited"):
            assert f'reason="{reason}"' in rejected, reason
        assert all(_closed(connection) for connection in idle)
    finally:
        for connection in idle:
            connection.close()
        for process in (gateway, node):
            stop_process(process)
        stack.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


def _https_healthy(base: str, verify: ssl.SSLContext) -> bool:
    try:
        return httpx.get(f"{base}/healthz", verify=verify, timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def _closed(connection: socket.socket) -> bool:
    """Whether the server has closed ``connection`` (waiting up to 30 s for it to)."""
    connection.settimeout(30)
    try:
        return connection.recv(4096) == b""
    except TimeoutError:
        return False
    except (ConnectionResetError, ssl.SSLError):
        return True
