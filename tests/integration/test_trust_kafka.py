"""No worker can command another: Ed25519 keys with a trust list, and least privilege on a
real broker (SASL/SCRAM, the KRaft StandardAuthorizer, dsec's ACLs).

A worker holds public keys and worker credentials only; whatever it forges is refused by
the broker (and logged by its authorizer), and what it signs is refused by every gate
(and reported). Key rotation: the old and new command keys overlap, then the old one is
revoked and refused from the next command on."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from helpers import stop_stack, wait_for
from pydantic import SecretStr
from typer.testing import CliRunner

from dsec.actuators import ApplyHooks, NodeActuator, NodeActuatorConfig, WorkerChannel
from dsec.bench.traces import TraceIdentity, slow_grad_sync
from dsec.infra.kafka_acls import apply_users, dsec_users
from dsec.infra.kafka_clients import consumer_config, producer_config
from dsec.infra.kafka_local import BrokerAuth, LocalKafka
from dsec.infra.keys import (
    KeyFileError,
    read_private_key,
    signer_for,
    signing_env,
    verifier_for,
)
from dsec.infra.topics import ensure_topics
from dsec.policy_engine.registry import PolicyRegistry
from dsec.schemas import (
    ActuationCommand,
    ActuationResult,
    FeatureEvent,
    PolicySpec,
    WorkerIdentity,
    decode,
    encode,
    new_event_id,
    now_ms,
    topic_names,
)
from dsec.schemas.actuations import GradCompressionParams, SamplerParams
from dsec.schemas.feature_columns import feature_events
from dsec.schemas.metrics import encode_packed
from dsec.schemas.policies import DecisionKind
from dsec.schemas.settings import DsecSettings
from dsec.schemas.signing import Ed25519Signer, Signer
from dsec.schemas.trust import KeyRole

pytestmark = pytest.mark.integration


class Results:
    """The results topic from its beginning, read as the test goes."""

    def __init__(self, settings: DsecSettings) -> None:
        self._consumer = Consumer(consumer_config(
            settings, group_id=f"test-results-{uuid.uuid4().hex[:6]}"))
        topic = topic_names(settings.topic_prefix).actuation_results
        partitions = self._consumer.list_topics(topic, timeout=30).topics[topic].partitions
        # assigned, not subscribed: no group to join on a loaded machine
        self._consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        self.seen: list[ActuationResult] = []

    def of(self, actuation_id: str) -> list[ActuationResult]:
        while (message := self._consumer.poll(0.1)) is not None:
            if not message.error():
                self.seen.append(decode(message.value(), ActuationResult))
        return [r for r in self.seen if r.actuation_id == actuation_id]

    def wait(self, actuation_id: str) -> ActuationResult:
        return wait_for(lambda: (self.of(actuation_id) or [None])[0], 60,
                        what=f"the result of {actuation_id}")

    def close(self) -> None:
        self._consumer.close()


def _command(signer: Signer, target: WorkerIdentity, action=None) -> ActuationCommand:
    at = now_ms()
    return signer.sign(ActuationCommand(
        actuation_id=new_event_id(), event_time_ms=at, expires_at_ms=at + 60_000,
        target=target, policy_name="trust-test", policy_version=1,
        action=action or SamplerParams(paused=True)))


# --- least privilege ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def secured_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    broker = LocalKafka(data_dir=tmp_path_factory.mktemp("secured-kafka"), auth=BrokerAuth())
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def _as_user(broker: LocalKafka, base: DsecSettings, name: str, password: str,
             **changes: object) -> DsecSettings:
    return base.model_copy(update={
        "bootstrap": broker.bootstrap, "kafka_security_protocol": "SASL_PLAINTEXT",
        "kafka_sasl_mechanism": "SCRAM-SHA-512", "kafka_sasl_username": name,
        "kafka_sasl_password": SecretStr(password), **changes})


def _deliveries(settings: DsecSettings, records: list[tuple[str, bytes, bytes]]) -> list:
    """Each record's delivery error (None: delivered), as a probe's producer counts them."""
    errors: dict[int, object] = {}
    producer = Producer(producer_config(settings, client_id="rogue-worker",
                                        **{"message.timeout.ms": 20_000}))
    for index, (topic, key, value) in enumerate(records):
        producer.produce(topic, key=key, value=value,
                         on_delivery=lambda err, _m, i=index: errors.__setitem__(i, err))
    producer.flush(30)
    return [errors.get(index, "not reported") for index in range(len(records))]


def test_a_worker_with_public_keys_and_worker_credentials_commands_no_one(
        secured_kafka: LocalKafka, tmp_path: Path) -> None:
    broker = secured_kafka
    auth = broker.auth
    assert auth is not None
    prefix = f"t{uuid.uuid4().hex[:10]}"
    topics = topic_names(prefix)
    engine = _as_user(broker, DsecSettings(topic_prefix=prefix, data_dir=tmp_path / "engine",
                                           job_id="acl-job"),
                      auth.admin_user, auth.admin_password)
    ensure_topics(engine, partitions=2)
    users = dsec_users(prefix)
    passwords = {user.name: uuid.uuid4().hex for user in users.values()}
    apply_users(broker.client_config(), [users["worker"], users["node-actuator"]], passwords)
    engine_signer = signer_for(engine, KeyRole.COMMAND_SIGNER)  # the keyring is made here

    # The worker and the node actuator get the trust list: public keys, no private key.
    public_only = tmp_path / "public"
    public_only.mkdir()
    shutil.copy(engine.trust_list_path(), public_only / "trust.json")

    def holder(role: str, folder: str) -> DsecSettings:
        name = users[role].name
        return _as_user(broker, engine, name, passwords[name], data_dir=tmp_path / folder,
                        trust_list=public_only / "trust.json")

    worker, node = holder("worker", "worker"), holder("node-actuator", "node")
    with pytest.raises(KeyFileError, match="no private key"):
        signer_for(worker, KeyRole.COMMAND_SIGNER)

    victim = WorkerIdentity(job_id="acl-job", worker_id="victim", node_id="node-victim")
    forged = _command(Ed25519Signer(Ed25519PrivateKey.generate()), victim)
    forged_policy = Ed25519Signer(Ed25519PrivateKey.generate()).sign(PolicySpec.model_validate({
        "name": "pause-everyone", "condition": "gpu_temperature_c > 0.0",
        "action": {"params": {"kind": "sampler", "paused": True}}}))

    # 1. The broker: the worker writes metrics and reads commands, and writes no command
    #    and no policy; the authorizer logs each refusal.
    metrics_ok, command_write, policy_write = _deliveries(worker, [
        (topics.metrics, b"w", b"{}"),
        (topics.actuations, victim.node_id.encode(), encode(forged)),
        (topics.policies, b"pause-everyone", encode(forged_policy)),
    ])
    assert metrics_ok is None
    for refused in (command_write, policy_write):
        assert refused is not None and refused.name() == "TOPIC_AUTHORIZATION_FAILED", refused
    server_log = broker.data_dir / "logs" / "server.log"

    def denied(topic: str) -> bool:
        # WRITE when the topic is visible to the user; DESCRIBE (its metadata) when not
        return any(f"User:{users['worker'].name} is Denied operation = " in line
                   and f"on resource = Topic:LITERAL:{topic} " in line
                   for line in server_log.read_text().splitlines())

    wait_for(lambda: denied(topics.actuations) and denied(topics.policies), 30,
             what="the authorizer's log of both refusals")
    reader = Consumer(consumer_config(worker, group_id="dsec-worker-acl-job-w"))
    try:
        metadata = reader.list_topics(topics.actuations, timeout=10).topics[topics.actuations]
        assert metadata.error is None  # the commands topic is readable by workers
    finally:
        reader.close()

    # 2. The gates: the forgery, written by someone allowed to write there, is refused by
    #    the victim's node actuator and reported; the forged policy by the registry.
    results = Results(engine)
    node_producer = Producer(producer_config(node, client_id="node-victim"))
    daemon = NodeActuator(
        NodeActuatorConfig(node_id=victim.node_id, run_dir=Path(tempfile.mkdtemp(
            prefix="dsec-acl-")), actuations_topic=topics.actuations,
            results_topic=topics.actuation_results, verifier=verifier_for(node),
            dead_letters_topic=topics.dead_letters),
        consumer_config(node, group_id=f"{prefix}-node-{victim.node_id}"),
        lambda topic, key, value: node_producer.produce(topic, key=key, value=value),
    )
    daemon.start()
    try:
        assert daemon.wait_ready(60)
        admin = Producer(producer_config(engine, client_id="admin"))
        genuine = _command(engine_signer, victim, GradCompressionParams(bits=8))
        for command in (forged, genuine):
            admin.produce(topics.actuations, key=victim.node_id.encode(), value=encode(command))
        assert admin.flush(30) == 0
        refused = wait_for(lambda: (node_producer.poll(0.1), results.of(forged.actuation_id))[1],
                           60, what="the forgery's result")
        assert [(r.status.value, r.identity.worker_id) for r in refused] == [
            ("rejected", "victim")]
        assert "not in the trust list" in refused[0].detail
    finally:
        daemon.stop()
        node_producer.flush(10)
        results.close()
    record = PolicyRegistry(verifier_for(worker)).offer(b"pause-everyone",
                                                        encode(forged_policy))
    assert record.decision is DecisionKind.POLICY_REJECTED
    assert "not in the trust list" in record.detail


def _service(args: list[str], settings: DsecSettings, user: str, password: str,
             log_path: Path) -> subprocess.Popen:
    """A dsec command in its own process, as ``user``."""
    env = {**os.environ, **signing_env(settings), "DSEC_BOOTSTRAP": settings.bootstrap,
           "DSEC_TOPIC_PREFIX": settings.topic_prefix, "DSEC_DATA_DIR": str(log_path.parent),
           "DSEC_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
           "DSEC_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "DSEC_KAFKA_SASL_USERNAME": user,
           "DSEC_KAFKA_SASL_PASSWORD": password, "DSEC_STREAM_SESSION_TIMEOUT_S": "10"}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        return subprocess.Popen([sys.executable, "-m", "dsec.cli", *args], env=env,
                                stdout=log, stderr=subprocess.STDOUT)


def test_publisher_stream_jobs_and_engine_each_run_on_their_own_user(
        secured_kafka: LocalKafka, tmp_path: Path) -> None:
    """Their ACLs are enough for what they do: the publisher reads the policy log and
    writes a policy; the stream jobs read a worker's samples and write features (their
    Faust group and table changelogs); the engine reads the policy log at start and
    features, and writes signed commands and decisions."""
    broker = secured_kafka
    auth = broker.auth
    assert auth is not None
    prefix = f"t{uuid.uuid4().hex[:10]}"
    topics = topic_names(prefix)
    admin = _as_user(broker, DsecSettings(topic_prefix=prefix, data_dir=tmp_path / "keys-home"),
                     auth.admin_user, auth.admin_password)
    ensure_topics(admin, partitions=2)
    users = dsec_users(prefix)
    passwords = {user.name: uuid.uuid4().hex for user in users.values()}
    apply_users(broker.client_config(), users.values(), passwords)
    signer_for(admin, KeyRole.COMMAND_SIGNER)  # the keyring every process here shares

    def run_as(role: str, args: list[str]) -> subprocess.Popen:
        name = users[role].name
        return _service(args, admin, name, passwords[name], tmp_path / role / "out.log")

    policy = tmp_path / "hot.yaml"
    policy.write_text("name: hot\ncondition: 'gpu_temperature_c > 95.0'\n"
                      "action: {params: {kind: snapshot}}\n")
    published = run_as("publisher", ["policy", "publish", str(policy)])
    assert published.wait(timeout=120) == 0, (tmp_path / "publisher" / "out.log").read_text()

    stream_jobs = run_as("stream-jobs", ["up", "--services", "stream-jobs"])
    engine = run_as("policy-engine", ["policy", "serve"])
    reader = Consumer(consumer_config(admin, group_id=f"test-{uuid.uuid4().hex[:6]}"))
    reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING)
                   for topic in (topics.actuations, topics.features) for p in (0, 1)])
    try:
        worker = _as_user(broker, admin, users["worker"].name, passwords[users["worker"].name])
        slow = TraceIdentity(job_id="acl-job", worker_id="slow", node_id="node-slow",
                             start_ms=now_ms() - 60_000)
        samples = [(topics.metrics, b"slow", encode_packed(batch))
                   for batch in slow_grad_sync(slow, seconds=5, latency_ms=20.0)]
        assert _deliveries(worker, samples) == [None] * len(samples)
        hot = WorkerIdentity(job_id="acl-job", worker_id="hot", node_id="node-hot")
        producer = Producer(producer_config(admin, client_id="features"))
        for t in range(0, 60, 5):
            producer.produce(topics.features, key=b"hot", value=encode(FeatureEvent(
                identity=hot, event_time_ms=now_ms() - 60_000 + t * 1000,
                features={"gpu_temperature_c": 99.0})))
        assert producer.flush(30) == 0
        seen: dict[str, list] = {topics.actuations: [], topics.features: []}

        def both() -> bool:
            for process in (stream_jobs, engine):
                assert process.poll() is None, process.args
            message = reader.poll(0.5)
            if message is not None and not message.error():
                seen[message.topic()].append(message.value())
            features = [e for v in seen[topics.features] for e in feature_events(v)]
            return any(f.identity.worker_id == "slow" for f in features) and any(
                decode(v, ActuationCommand).policy_name == "hot"
                for v in seen[topics.actuations])

        try:
            wait_for(both, 180, interval_s=0, what="features from the stream jobs and the hot "
                     "policy's command from the engine")
        except BaseException:
            for role in ("stream-jobs", "policy-engine"):
                print(f"--- {role}, last lines", _tail(tmp_path / role / "out.log"), sep="\n")
            raise
        command = next(c for c in (decode(v, ActuationCommand) for v in seen[topics.actuations])
                       if c.policy_name == "hot")
        assert command.target == hot
        assert verifier_for(admin).verify(command).role is KeyRole.COMMAND_SIGNER
    finally:
        for process in (stream_jobs, engine):
            stop_stack(process)
        reader.close()
    for role in ("publisher", "stream-jobs", "policy-engine"):
        log = (tmp_path / role / "out.log").read_text()
        # librdkafka's words, then aiokafka's (the Faust apps)
        for refused in ("AUTHORIZATION_FAILED", "AuthorizationFailed", "not authorized"):
            assert refused not in log, (role, _tail(tmp_path / role / "out.log"))


def _tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def test_a_delivery_the_broker_refuses_holds_the_batch_until_it_is_taken(
        secured_kafka: LocalKafka, tmp_path: Path) -> None:
    """Nothing lost when the broker refuses a stream job's output: the stream-jobs user
    starts without its write ACL on gpu-cards, so the metrics job's card report of the
    worker's first batch is refused. The batch is tried again, not acknowledged; once the
    ACL is granted, the report goes through and the card job tells the worker its card,
    though the worker sent nothing more."""
    broker = secured_kafka
    auth = broker.auth
    assert auth is not None
    prefix = f"t{uuid.uuid4().hex[:10]}"
    topics = topic_names(prefix)
    admin = _as_user(broker, DsecSettings(topic_prefix=prefix, data_dir=tmp_path / "keys-home"),
                     auth.admin_user, auth.admin_password)
    ensure_topics(admin, partitions=2)
    users = dsec_users(prefix)
    passwords = {user.name: uuid.uuid4().hex for user in users.values()}
    full = users["stream-jobs"]
    refused = dataclasses.replace(full, acls=tuple(
        dataclasses.replace(acl, operations=tuple(o for o in acl.operations if o != "Write"))
        if acl.name == topics.gpu_cards else acl for acl in full.acls))
    apply_users(broker.client_config(), [refused, users["worker"]], passwords)
    signer_for(admin, KeyRole.COMMAND_SIGNER)
    log = tmp_path / "stream-jobs" / "out.log"
    stream_jobs = _service(["up", "--services", "stream-jobs"], admin, full.name,
                           passwords[full.name], log)
    reader = Consumer(consumer_config(admin, group_id=f"test-{uuid.uuid4().hex[:6]}"))
    reader.assign([TopicPartition(topics.features, p, OFFSET_BEGINNING) for p in (0, 1)])
    try:
        worker = _as_user(broker, admin, users["worker"].name, passwords[users["worker"].name])
        ident = TraceIdentity(job_id="acl-job", worker_id="w-card", node_id="node-card",
                              start_ms=now_ms() - 10_000)
        samples = [(topics.metrics, b"w-card", encode_packed(batch))
                   for batch in slow_grad_sync(ident, seconds=3, latency_ms=20.0)]
        assert _deliveries(worker, samples) == [None] * len(samples)
        wait_for(lambda: "TopicAuthorizationFailed" in log.read_text(errors="replace"), 120,
                 what="the metrics job's refused card report")
        # revoking Describe too would hide the topic; Write alone is what was missing
        apply_users(broker.client_config(), [full], passwords)
        told: list[FeatureEvent] = []

        def card_told() -> bool:
            assert stream_jobs.poll() is None, _tail(log)
            message = reader.poll(0.5)
            if message is not None and not message.error():
                told.extend(event for event in feature_events(message.value())
                            if "card_workers" in event.features)
            return bool(told)

        try:
            wait_for(card_told, 120, interval_s=0, what="the card job's word to the worker")
        except BaseException:
            print("--- stream-jobs, last lines", _tail(log), sep="\n")
            raise
        assert told[0].identity.worker_id == "w-card"
        assert told[0].features["card_workers"] == 1.0
    finally:
        stop_stack(stream_jobs)
        reader.close()
    assert "Crashed" not in log.read_text(errors="replace"), _tail(log)


# --- key rotation -------------------------------------------------------------------------


def test_rotated_command_keys_overlap_then_the_revoked_one_is_refused(
        settings: DsecSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = Path(tempfile.mkdtemp(prefix="dsec-rotate-"))
    settings = settings.model_copy(update={"run_dir": run_dir})
    topics = topic_names(settings.topic_prefix)
    ensure_topics(settings, partitions=2)
    engine = signer_for(settings, KeyRole.COMMAND_SIGNER)  # reads its key file again if replaced
    # an engine replica not yet given the new key
    straggler = Ed25519Signer(read_private_key(settings.keys_directory() / "command-signer.pem"))
    producer = Producer(producer_config(settings, client_id="test-rotation"))

    def publish(topic: str, key: bytes, value: bytes) -> None:
        producer.produce(topic, key=key, value=value)
        producer.poll(0)

    daemon = NodeActuator(
        NodeActuatorConfig(node_id="node-rot", run_dir=run_dir,
                           actuations_topic=topics.actuations,
                           results_topic=topics.actuation_results,
                           verifier=verifier_for(settings)),
        consumer_config(settings, group_id=f"{settings.topic_prefix}-node-rot"), publish,
    ).start()
    identity = WorkerIdentity(job_id=settings.job_id, worker_id="w-rot", node_id="node-rot")
    applied: list[int] = []
    hooks = ApplyHooks()
    hooks.register("grad_compression", lambda p: applied.append(p.bits) or f"{p.bits} bits")
    worker = WorkerChannel(identity, daemon.socket_path, hooks).start()
    results = Results(settings)
    monkeypatch.setenv("DSEC_DATA_DIR", str(settings.data_dir))
    cli = CliRunner()
    from dsec.cli import app

    def send(signer: Signer, bits: int) -> ActuationResult:
        command = _command(signer, identity, GradCompressionParams(bits=bits))
        producer.produce(topics.actuations, key=b"node-rot", value=encode(command))
        producer.flush(10)
        return wait_for(lambda: (worker.apply_pending(), results.of(command.actuation_id))[1],
                        60, what=f"the result of {bits} bits")[0]

    try:
        assert daemon.wait_ready(30)
        wait_for(lambda: worker.registered, 30, what="the worker registered")
        old_id = straggler.key_id
        assert send(engine, 16).status.value == "applied"

        rotated = cli.invoke(app, ["keys", "generate", "command-signer", "--replace"])
        assert rotated.exit_code == 0, rotated.output
        assert engine.sign(_command(straggler, identity)).signature.split(":")[1] != old_id
        assert send(engine, 8).status.value == "applied"  # the new key
        assert send(straggler, 4).status.value == "applied"  # the old one, in the overlap

        revoked = cli.invoke(app, ["keys", "revoke", old_id])
        assert revoked.exit_code == 0, revoked.output
        refused = send(straggler, 32)
        assert refused.status.value == "rejected" and "revoked" in refused.detail
        assert send(engine, 32).status.value == "applied"
        assert applied == [16, 8, 4, 32]
    finally:
        worker.stop()
        daemon.stop()
        producer.flush(10)
        results.close()

