"""The probe's transport in endpoint mode: batches to the ingest gateway over HTTP, for
workers that cannot reach Kafka.

It keeps the Kafka transport's contract: ``send`` never blocks (a bounded queue; full
means refused, and the probe keeps the samples in its own bounded buffer), every message
is reported delivered or not exactly once, a message the gateway cannot take for now is
tried again in order until its ``message_timeout_s``, and one it refuses for its content is
reported lost at once. One sender thread posts the queue in order and runs the delivery
reports.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

from dsec.ingest.config import ProbeConfig
from dsec.ingest.gateway_client import Answer, GatewayClient, Outcome
from dsec.ingest.transport import DeliveryCallback
from dsec.schemas import RuntimeRegistration, WorkerIdentity

log = logging.getLogger(__name__)

RUNTIME_TYPE = "dsec-probe"


@dataclass(frozen=True)
class HttpTransportConfig:
    queue_max_messages: int = 10_000
    message_timeout_s: float = 300.0
    backoff_min_s: float = 0.1
    backoff_max_s: float = 5.0


@dataclass
class _Message:
    body: bytes
    on_delivery: DeliveryCallback
    expires_s: float
    settled: bool = field(default=False)


def post_body(value: bytes) -> bytes:
    """A probe's encoded ``MetricBatch`` as the gateway's post: its columns (or rows) named
    by its own message id; the identity comes from the registration."""
    batch = orjson.loads(value)
    body: dict = {"batch_id": batch["event_id"]}
    for form in ("columns", "samples"):
        if batch.get(form):
            body[form] = batch[form]
    return orjson.dumps(body)


class HttpTransport:
    def __init__(self, client: GatewayClient, metrics_topic: str,
                 config: HttpTransportConfig | None = None,
                 monotonic_s: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._metrics_topic = metrics_topic
        self._config = config or HttpTransportConfig()
        self._monotonic_s = monotonic_s
        self._queue: deque[_Message] = deque()
        self._changed = threading.Condition()
        self._closing = False
        self._problem = ""  # the last failure logged, so that a lasting one is logged once
        self._thread = threading.Thread(target=self._run, name="dsec-probe-http", daemon=True)
        self._thread.start()

    def send(self, topic: str, key: bytes, value: bytes, on_delivery: DeliveryCallback) -> bool:
        if topic != self._metrics_topic:  # results and the like travel by Kafka only
            on_delivery(False, f"endpoint mode sends metrics only, not {topic}")
            return True
        with self._changed:
            if self._closing or len(self._queue) >= self._config.queue_max_messages:
                return False
            self._queue.append(_Message(
                post_body(value), on_delivery,
                self._monotonic_s() + self._config.message_timeout_s))
            self._changed.notify_all()
        return True

    def poll(self) -> None:
        """Delivery reports run on the sender thread as answers come: nothing to serve."""

    def flush(self, timeout_s: float) -> int:
        deadline_s = self._monotonic_s() + timeout_s
        with self._changed:
            while self._queue and (left_s := deadline_s - self._monotonic_s()) > 0:
                self._changed.wait(left_s)
            return len(self._queue)

    def close(self) -> None:
        with self._changed:
            if self._closing:
                return
            self._closing = True
            left = list(self._queue)
            self._queue.clear()
            self._changed.notify_all()
        for message in left:
            self._settle(message, False, "the probe shut down before the gateway took it")
        self._thread.join(timeout=0.5)  # a request under way ends by its own timeout
        if not self._thread.is_alive():
            self._client.close()

    def _settle(self, message: _Message, delivered: bool, error: str) -> None:
        with self._changed:
            if message.settled:
                return
            message.settled = True
            if self._queue and self._queue[0] is message:
                self._queue.popleft()
            self._changed.notify_all()
        message.on_delivery(delivered, error)

    def _note(self, answer: Answer) -> None:
        if answer.outcome is Outcome.SENT:
            if self._problem:
                log.warning("dsec: reporting to %s again", self._client.endpoint)
            self._problem = ""
        elif answer.detail != self._problem:
            self._problem = answer.detail
            log.warning("dsec: %s", answer.detail)

    def _run(self) -> None:
        backoff_s = 0.0
        while True:
            with self._changed:
                while not self._queue and not self._closing:
                    self._changed.wait()
                if self._closing:
                    return
                message = self._queue[0]
            if self._monotonic_s() >= message.expires_s:
                self._settle(message, False, f"not taken by the gateway within "
                             f"{self._config.message_timeout_s:g} s")
                continue
            try:
                answer = self._client.post_batch(message.body)
            except Exception as exc:  # the sender outlives any one bad answer
                answer = Answer(Outcome.REFUSED, f"posting failed: {exc!r}")
            self._note(answer)
            if answer.outcome is not Outcome.RETRY:
                backoff_s = 0.0
                self._settle(message, answer.outcome is Outcome.SENT, answer.detail)
                continue
            backoff_s = min(self._config.backoff_max_s,
                            max(self._config.backoff_min_s, backoff_s * 2))
            retry_s = self._monotonic_s() + max(backoff_s, answer.retry_after_s)
            retry_s = min(retry_s, message.expires_s)
            with self._changed:  # new messages queue up behind this one meanwhile
                while not self._closing and (left_s := retry_s - self._monotonic_s()) > 0:
                    self._changed.wait(left_s)


def endpoint_transport(endpoint: str, token: str, identity: WorkerIdentity, metrics_topic: str,
                       config: ProbeConfig) -> HttpTransport:
    """The transport of a probe in endpoint mode, registered under the worker's identity."""
    registration = RuntimeRegistration(
        runtime_id=identity.worker_id, runtime_type=RUNTIME_TYPE, concurrency=1,
        mean_call_latency_ms=0.0, function_calling=False, job_id=identity.job_id,
        node_id=identity.node_id, pool=identity.pool, labels=identity.labels,
    )
    client = GatewayClient(endpoint, token, registration, config.endpoint_request_timeout_s)
    return HttpTransport(client, metrics_topic, HttpTransportConfig(
        queue_max_messages=config.transport_queue_max_messages,
        message_timeout_s=config.message_timeout_s,
    ))
