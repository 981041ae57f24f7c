"""The alert notifier: policy decisions in; alerts out to people, to the alerts topic (and
so to ClickHouse), and GPU health to its compacted topic.

One ``ConsumerLoop`` over the decisions topic. Each decision goes through the
``AlertTracker``, which says which alerts start or end and which GPUs turn degraded or
healthy; each alert that starts or ends is posted to every configured receiver in
Alertmanager's webhook format (``DSEC_ALERT_WEBHOOK_URLS``), then the state changes are
published, then the offsets committed. A notification is sent once per change: the
tracker's state, rebuilt from the alerts and GPU-health topics when the loop starts,
knows what was already announced. A crash between a post and the commit posts it again
(at least once, like Alertmanager itself).

A receiver that refuses a post (not 2xx, unreachable) is tried again up to
``alert_webhook_attempts`` times; after that the decision is dead-lettered with the
reason and counted, and the loop goes on. An undecodable decision is dead-lettered too.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import Consumer, Message, Producer

from dsec.infra.consumer_loop import (
    BatchWriter,
    ConsumerLoop,
    ConsumerLoopConfig,
    FailedMessages,
)
from dsec.infra.dead_letter_producer import DeadLetterProducer, DeadLetterPublisher
from dsec.infra.durable_publish import publish_durably
from dsec.infra.kafka_clients import consumer_config, producer_config
from dsec.infra.observability.metrics import (
    ALERT_NOTIFICATIONS,
    EVENTS_IN,
    EVENTS_OUT,
    ProcessMetrics,
)
from dsec.policy_engine.alerts import AlertConfig, AlertTracker
from dsec.schemas import DeadLetter, DecodeError, PolicyDecision, decode, encode, topic_names
from dsec.schemas.alerts import AlertEvent, GpuHealthEvent
from dsec.schemas.settings import DsecSettings
from dsec.services.alertmanager import webhook_payload
from dsec.services.restored_loop import RestoredLoopService, read_to_end

__all__ = ["SERVICE", "AlertNotifier", "post_json"]

log = logging.getLogger(__name__)
SERVICE = "alert-notifier"
RECEIVER = "dsec"
PostJson = Callable[[str, bytes, float], int]  # (url, body, timeout_s) -> HTTP status


def post_json(url: str, body: bytes, timeout_s: float) -> int:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


class AlertNotifier(RestoredLoopService, BatchWriter[Sequence[Message]]):
    thread_name = "dsec-alert-notifier"
    not_running = "the alert notifier is not running"

    def __init__(
        self,
        settings: DsecSettings,
        metrics: ProcessMetrics | None = None,
        *,
        config: AlertConfig | None = None,
        post: PostJson = post_json,
        retry_wait: Callable[[float], object] | None = None,
        consumer_factory: Callable[[dict], Any] = Consumer,
        dead_letters: DeadLetterPublisher | None = None,
    ) -> None:
        """``post``, ``retry_wait`` (how a retry's backoff is waited; default: on the stop
        event), ``consumer_factory`` and ``dead_letters``: the I/O, but in tests."""
        self._settings = settings
        self.topics = topics = topic_names(settings.topic_prefix)
        metrics = metrics or ProcessMetrics()
        self._stop = threading.Event()
        self.tracker = AlertTracker(config)
        self._post = post
        self._retry_wait = retry_wait or self._stop.wait
        self._receivers = list(settings.alert_webhook_urls)
        self._producer = Producer(producer_config(settings, "dsec-alert-notifier"))
        self._dead_letters = dead_letters or DeadLetterProducer(
            producer_config(settings, "dsec-alert-notifier-dead-letters"), topics.dead_letters,
            SERVICE, metrics)
        self._consumer_factory = consumer_factory
        self._notifications = metrics.counter(ALERT_NOTIFICATIONS)
        self._decisions_in = metrics.counter(EVENTS_IN).labels(SERVICE, topics.decisions)
        self._alerts_out = metrics.counter(EVENTS_OUT).labels(SERVICE, topics.alerts)
        self._gpu_health_out = metrics.counter(EVENTS_OUT).labels(SERVICE, topics.gpu_health)
        group = f"{settings.topic_prefix}-alert-notifier"
        self._loop = ConsumerLoop(
            ConsumerLoopConfig((topics.decisions,), group, poll_timeout_s=0.2,
                               return_on_first=True),
            consumer_config(settings, group), self, self._dead_letter, service=SERVICE,
            metrics=metrics, stop=self._stop, consumer_factory=consumer_factory)
        metrics.add_health_check(SERVICE, self.health)

    def restore(self, timeout_s: float = 60.0) -> None:
        """The tracker's state from what the alerts and GPU-health topics hold now."""
        read = _TopicContents(self.topics.alerts)
        read_to_end(self._settings, (self.topics.alerts, self.topics.gpu_health), read,
                    group_prefix=f"{self._settings.topic_prefix}-alert-notifier-restore",
                    service=SERVICE, what="the alerts and GPU-health topics",
                    timeout_s=timeout_s, consumer_factory=self._consumer_factory)
        self.tracker = AlertTracker(self.tracker.config)
        self.tracker.restore(read.alerts, read.gpus)

    # --- one batch ----------------------------------------------------------------------

    def write(self, batch: Sequence[Message]) -> None:
        failures: list[tuple[Message, str]] = []
        changes: list[AlertEvent | GpuHealthEvent] = []
        for message in batch:
            self._decisions_in.inc()
            try:
                decision = decode(message.value(), PolicyDecision)
            except DecodeError as exc:
                failures.append((message, exc.reason))
                continue
            made = self.tracker.process(decision)
            changes.extend(made)
            for alert in (c for c in made if isinstance(c, AlertEvent)):
                problem = self._notify(alert)
                if problem is not None:
                    failures.append((message, problem))
        self._publish(changes)
        if failures:
            raise FailedMessages(failures)

    def _notify(self, alert: AlertEvent) -> str | None:
        """Posts ``alert`` to every receiver; None once each took it, else what failed."""
        body = json.dumps(webhook_payload(alert, RECEIVER)).encode()
        problems = []
        for url in self._receivers:
            problem = self._post_with_retries(url, body)
            result = "delivered" if problem is None else "failed"
            self._notifications.labels(alert.status.value, result).inc()
            if problem is not None:
                log.warning("alert %s (%s) not delivered to %s: %s", alert.alertname,
                            alert.status.value, url, problem)
                problems.append(f"{url}: {problem}")
        if problems:
            return f"alert {alert.alertname} ({alert.status.value}) not delivered: " + \
                "; ".join(problems)
        return None

    def _post_with_retries(self, url: str, body: bytes) -> str | None:
        attempts = self._settings.alert_webhook_attempts
        problem = None
        for attempt in range(attempts):
            if attempt:
                self._retry_wait(min(0.5 * 2 ** (attempt - 1), 10.0))
            try:
                status = self._post(url, body, self._settings.alert_webhook_timeout_s)
            except Exception as exc:  # an unreachable receiver is a failed delivery
                problem = f"unreachable: {type(exc).__name__}: {exc}"
                continue
            if 200 <= status < 300:
                return None
            problem = f"answered HTTP {status}"
        return f"{problem} after {attempts} attempt(s)"

    def _publish(self, changes: list[AlertEvent | GpuHealthEvent]) -> None:
        publish_durably(self._producer, (
            (self.topics.alerts, change.fingerprint.encode(), encode(change))
            if isinstance(change, AlertEvent)
            else (self.topics.gpu_health, change.gpu_uuid.encode(), encode(change))
            for change in changes), "alert state")
        alerts = sum(isinstance(c, AlertEvent) for c in changes)
        self._alerts_out.inc(alerts)
        self._gpu_health_out.inc(len(changes) - alerts)

    def _dead_letter(self, message: Message, reason: str) -> None:
        self._dead_letters.publish([DeadLetter.for_message(
            topic=message.topic(), partition=message.partition(), offset=message.offset(),
            reason=reason, payload=message.value())])


class _TopicContents(BatchWriter[Sequence[Message]]):
    """What a bounded read of the alerts and GPU-health topics found."""

    def __init__(self, alerts_topic: str) -> None:
        self._alerts_topic = alerts_topic
        self.alerts: list[AlertEvent] = []
        self.gpus: list[GpuHealthEvent] = []

    def write(self, batch: Sequence[Message]) -> None:
        for message in batch:
            if message.value() is None:
                continue
            model = AlertEvent if message.topic() == self._alerts_topic else GpuHealthEvent
            try:
                event = decode(message.value(), model)
            except DecodeError as exc:
                log.warning("alert notifier: skipping %s@%d: %s", message.topic(),
                            message.offset(), exc.reason)
                continue
            (self.alerts if model is AlertEvent else self.gpus).append(event)  # type: ignore[arg-type]
