"""Delivers actuation commands addressed to registered runtimes to their webhooks.

The gateway stands in for the node actuator of runtimes that cannot consume Kafka. Its
``CommandSource`` reads only the messages keyed to the nodes its runtimes registered
with (every runtime on ``external`` unless it named a node), as a consumer-group member
committing once a batch is handled, so a flood of commands for other nodes costs a key
comparison each and a flood for its own nodes costs a decode and a signature check each,
never a commit. Each command goes through the ``CommandPipeline``: the gate (addressed
to a registered runtime, signature, expiry, duplicates), then ``WebhookPoster``, which
POSTs it as JSON and reads the runtime's answer as the actuation result. A runtime answers
2xx, optionally with ``{"status": "applied" | "failed" | "rejected" | "unsupported",
"detail": "..."}`` (unsupported: the runtime cannot carry that action out).
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer

from dsec.actuators.command_source import CommandSource, dead_letters_to
from dsec.actuators.gate import AddressedTo, CommandGate
from dsec.actuators.pipeline import Applier, CommandPipeline, Outcome
from dsec.actuators.results import DETAIL_MAX_CHARS, Publish, ResultPublisher
from dsec.infra.consumer_loop import ConsumerLoopConfig
from dsec.infra.observability.metrics import ProcessMetrics
from dsec.infra.runtime_registry import RuntimeRegistry
from dsec.schemas import ActuationCommand, ActuationStatus, Verifier, WorkerIdentity, encode
from dsec.schemas.actuations import COMMAND_MAX_FUTURE_MS

log = logging.getLogger(__name__)

PostJson = Callable[[str, bytes, float], tuple[int, bytes]]  # (url, body, timeout_s)
SERVICE = "ingest-gateway"
POLL_TIMEOUT_S = 0.2
_ANSWERS = {"applied": ActuationStatus.APPLIED, "failed": ActuationStatus.FAILED,
            "rejected": ActuationStatus.REJECTED,
            "unsupported": ActuationStatus.UNSUPPORTED}


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
    return status, str(answer.get("detail", "delivered to webhook"))[:DETAIL_MAX_CHARS]


def registered_runtime(registry: RuntimeRegistry, default_job_id: str) -> AddressedTo:
    """Commands for a runtime registered now, under the identity it registered with."""
    def addressed(target: WorkerIdentity) -> bool:
        registration = registry.get(target.worker_id)
        return registration is not None and registration.identity(default_job_id) == target
    return addressed


class WebhookPoster(Applier):
    """POSTs a command to its runtime's webhook; the answer is the command's outcome."""

    def __init__(self, registry: RuntimeRegistry, post: PostJson, timeout_s: float) -> None:
        self._registry = registry
        self._post = post
        self._timeout_s = timeout_s
        self.delivered = 0

    def apply(self, command: ActuationCommand) -> Outcome:
        registration = self._registry.get(command.target.worker_id)
        if registration is None or registration.webhook_url is None:
            return Outcome(ActuationStatus.REJECTED, "the runtime registered no webhook")
        try:
            http_status, body = self._post(str(registration.webhook_url), encode(command),
                                           self._timeout_s)
        except Exception as exc:  # an unreachable webhook is a failed actuation, not a crash
            return Outcome(ActuationStatus.FAILED, f"webhook unreachable: {exc}")
        self.delivered += 1
        return Outcome(*answer_status(http_status, body))


class WebhookForwarder:
    def __init__(
        self,
        registry: RuntimeRegistry,
        default_job_id: str,
        consumer_config: dict,
        actuations_topic: str,
        results_topic: str,
        verifier: Verifier,
        publish: Publish,
        timeout_s: float,
        post: PostJson = post_json,
        metrics: ProcessMetrics | None = None,
        max_future_ms: int = COMMAND_MAX_FUTURE_MS,
        dead_letters_topic: str | None = None,
        consumer_factory: Callable[[dict], Any] = Consumer,
    ) -> None:
        """``consumer_factory``: the Kafka client, ``confluent_kafka.Consumer`` but in
        tests."""
        metrics = metrics or ProcessMetrics()
        metrics.add_health_check("webhook-forwarder", self.health)
        self._registry = registry
        self._poster = WebhookPoster(registry, post, timeout_s)
        self._pipeline = CommandPipeline(
            CommandGate(None, verifier, addressed=registered_runtime(registry, default_job_id),
                        max_future_ms=max_future_ms),
            self._poster, ResultPublisher(results_topic, publish, service=SERVICE,
                                          metrics=metrics))
        self._source = CommandSource(
            ConsumerLoopConfig((actuations_topic,),
                               str(consumer_config.get("group.id", "dsec-gateway-webhooks")),
                               poll_timeout_s=POLL_TIMEOUT_S, return_on_first=True),
            consumer_config, keys=self._registered_nodes, take=self._pipeline.handle,
            undecodable=self._pipeline.undecodable,
            dead_letter=dead_letters_to(dead_letters_topic, publish, SERVICE),
            service=SERVICE, thread_name="dsec-webhooks", metrics=metrics,
            consumer_factory=consumer_factory)
        self._started = False

    @property
    def delivered(self) -> int:
        return self._poster.delivered

    def _registered_nodes(self) -> set[str]:
        return {registration.node_id for registration in self._registry.all()}

    def start(self) -> None:
        self._started = True
        self._source.start()

    def health(self) -> str | None:
        if not self._started:
            return "the webhook forwarder's consumer is not running"
        return self._source.down()

    def stop(self) -> None:
        self._source.stop()

    def handle(self, value: bytes | None) -> ActuationStatus | None:
        """One command off the topic (its key aside); None when nothing is reported: not
        for a registered runtime, or a duplicate."""
        return self._source.receive(value)
