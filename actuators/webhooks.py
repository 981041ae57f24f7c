"""Delivers actuation commands addressed to registered runtimes to their webhooks.

The gateway stands in for the node actuator of runtimes that cannot consume Kafka: it
checks each command as an actuator would (target, signature, expiry, duplicates), POSTs
it as JSON, and publishes the runtime's answer as the actuation result. A runtime answers
2xx, optionally with ``{"status": "applied" | "failed" | "rejected", "detail": "..."}``.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError

from dsec.actuators.gate import CommandGate
from dsec.infra.observability.kafka import ConsumerLag
from dsec.infra.observability.metrics import (
    ACTUATIONS,
    EVENTS_IN,
    EVENTS_OUT,
    ProcessMetrics,
    action_label,
)
from dsec.infra.runtime_registry import RuntimeRegistry
from dsec.schemas import (
    ActuationCommand,
    ActuationResult,
    ActuationStatus,
    DecodeError,
    RuntimeRegistration,
    WorkerIdentity,
    decode,
    encode,
    now_ms,
)
from dsec.schemas.actuations import COMMAND_MAX_FUTURE_MS

log = logging.getLogger(__name__)

Publish = Callable[[str, bytes, bytes], None]  # (topic, key, value)
PostJson = Callable[[str, bytes, float], tuple[int, bytes]]  # (url, body, timeout_s)
SERVICE = "ingest-gateway"
_ANSWERS = {"applied": ActuationStatus.APPLIED, "failed": ActuationStatus.FAILED,
            "rejected": ActuationStatus.REJECTED}


def post_json(url: str, body: bytes, timeout_s: float) -> tuple[int, bytes]:
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read(65536)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(65536)


def answer_status(http_status: int, body: bytes) -> tuple[ActuationStatus, str]:
    """The actuation result a webhook's answer stands for."""
    if not 200 <= http_status < 300:
        return ActuationStatus.FAILED, f"webhook answered HTTP {http_status}"
    try:
        answer = json.loads(body) if body else {}
    except ValueError:
        answer = {}
    if not isinstance(answer, dict):
        answer = {}
    status = _ANSWERS.get(str(answer.get("status", "applied")), ActuationStatus.APPLIED)
    return status, str(answer.get("detail", "delivered to webhook"))[:2048]


class WebhookForwarder:
    def __init__(
        self,
        registry: RuntimeRegistry,
        default_job_id: str,
        consumer_config: dict,
        actuations_topic: str,
        results_topic: str,
        signing_key: bytes,
        publish: Publish,
        timeout_s: float,
        post: PostJson = post_json,
        metrics: ProcessMetrics | None = None,
        max_future_ms: int = COMMAND_MAX_FUTURE_MS,
    ) -> None:
        self._registry = registry
        self._default_job_id = default_job_id
        metrics = metrics or ProcessMetrics()
        lag = ConsumerLag(metrics, SERVICE)
        self._consumer_config = {**consumer_config, "enable.auto.commit": False,
                                 **lag.client_config()}
        self._commands_in = metrics.counter(EVENTS_IN).labels(SERVICE, actuations_topic)
        self._results_out = metrics.counter(EVENTS_OUT).labels(SERVICE, results_topic)
        self._actuations = metrics.counter(ACTUATIONS)
        metrics.add_health_check("webhook-forwarder", self.health)
        self._actuations_topic = actuations_topic
        self._results_topic = results_topic
        self._signing_key = signing_key
        self._publish = publish
        self._timeout_s = timeout_s
        self._post = post
        self._max_future_ms = max_future_ms
        self._gates: dict[str, CommandGate] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.delivered = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="dsec-webhooks", daemon=True)
        self._thread.start()

    def health(self) -> str | None:
        if self._thread is None or not self._thread.is_alive():
            return "the webhook forwarder's consumer is not running"
        return None

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        consumer = Consumer(self._consumer_config)
        consumer.subscribe([self._actuations_topic])
        try:
            while not self._stop.is_set():
                message = consumer.poll(0.2)
                if message is None:
                    continue
                if message.error():
                    if message.error().code() != KafkaError._PARTITION_EOF:
                        log.warning("dsec webhooks: %s", message.error())
                    continue
                self._commands_in.inc()
                self.handle(message.value())
                consumer.commit(message=message, asynchronous=False)
        except Exception:
            log.exception("dsec webhooks: consumer stopped")
        finally:
            consumer.close()

    def _identity(self, registration: RuntimeRegistration) -> WorkerIdentity:
        return WorkerIdentity(job_id=registration.job_id or self._default_job_id,
                              worker_id=registration.runtime_id, node_id=registration.node_id)

    def handle(self, value: bytes | None) -> ActuationStatus | None:
        """One command off the topic; None when it is not for a registered runtime."""
        try:
            command = decode(value, ActuationCommand)
        except DecodeError as exc:
            log.warning("dsec webhooks: undecodable command: %s", exc.reason)
            return None
        registration = self._registry.get(command.target.worker_id)
        if registration is None:
            return None
        identity = self._identity(registration)
        gate = self._gates.get(registration.runtime_id)
        if gate is None:
            gate = CommandGate(identity, self._signing_key, max_future_ms=self._max_future_ms)
            self._gates[registration.runtime_id] = gate
        if not gate.addressed_here(command):
            return None
        rejection = gate.check(command, now_ms())
        if rejection is not None:
            if rejection.duplicate or not gate.reportable(command, rejection):
                return None
            status, detail = rejection.status, rejection.detail
        elif registration.webhook_url is None:
            status, detail = ActuationStatus.REJECTED, "the runtime registered no webhook"
        else:
            try:
                http_status, body = self._post(
                    str(registration.webhook_url), encode(command), self._timeout_s
                )
                status, detail = answer_status(http_status, body)
                self.delivered += 1
            except Exception as exc:  # an unreachable webhook is a failed actuation, not a crash
                status, detail = ActuationStatus.FAILED, f"webhook unreachable: {exc}"
        result = ActuationResult(
            actuation_id=command.actuation_id, identity=identity,
            action_kind=command.action.kind.value, status=status, detail=detail[:2048],
            command_time_ms=command.event_time_ms,
        )
        self._publish(self._results_topic, identity.node_id.encode(), encode(result))
        self._actuations.labels(SERVICE, action_label(result.action_kind), status.value).inc()
        self._results_out.inc()
        return status
