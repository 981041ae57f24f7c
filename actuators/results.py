"""Where the outcome of every command goes: an ``ActuationResult`` on the results topic,
keyed by the node of the worker it names."""

from __future__ import annotations

import logging
from collections.abc import Callable

from dsec.infra.observability.metrics import ACTUATIONS, EVENTS_OUT, ProcessMetrics, action_label
from dsec.schemas import ActuationCommand, ActuationResult, ActuationStatus, encode

log = logging.getLogger(__name__)

Publish = Callable[[str, bytes, bytes], None]  # (topic, key, value)
DETAIL_MAX_CHARS = 2048


class ResultPublisher:
    """Publishes results and counts them by status (and, given ``metrics``, by service,
    action and status). A result that cannot be published is logged: the caller, a consumer
    loop or a training thread, goes on."""

    def __init__(self, topic: str, publish: Publish, *, service: str = "actuator",
                 metrics: ProcessMetrics | None = None) -> None:
        self.topic = topic
        self.service = service
        self._publish = publish
        self._actuations = metrics.counter(ACTUATIONS) if metrics is not None else None
        self._out = (metrics.counter(EVENTS_OUT).labels(service, topic)
                     if metrics is not None else None)
        self.results: dict[ActuationStatus, int] = dict.fromkeys(ActuationStatus, 0)

    def report(self, command: ActuationCommand, status: ActuationStatus, detail: str, *,
               requested: str | None = None, in_force: str | None = None) -> None:
        """The result of ``command`` for the worker it names."""
        self.send(ActuationResult(
            actuation_id=command.actuation_id, identity=command.target,
            action_kind=command.action.kind.value, status=status,
            detail=detail[:DETAIL_MAX_CHARS], command_time_ms=command.event_time_ms,
            requested=requested, in_force=in_force,
        ))

    def send(self, result: ActuationResult) -> None:
        self.results[result.status] += 1
        if self._actuations is not None:
            self._actuations.labels(self.service, action_label(result.action_kind),
                                    result.status.value).inc()
        try:
            self._publish(self.topic, result.identity.node_id.encode(), encode(result))
        except Exception:
            log.exception("%s: result for %s not published", self.service,
                          result.actuation_id)
            return
        if self._out is not None:
            self._out.inc()
