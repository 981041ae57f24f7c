"""Consumer lag of confluent-kafka consumers: from librdkafka's own statistics (no extra
requests to the broker, parsed on the consumer's thread every few seconds), or as measured
by a ``ConsumerLoop`` and handed to ``ConsumerLag.report``."""

from __future__ import annotations

import logging

import orjson

from dsec.infra.observability.metrics import CONSUMER_LAG, ProcessMetrics
from dsec.schemas.units import s_to_ms

log = logging.getLogger(__name__)


class ConsumerLag:
    """Sets ``dsec_consumer_lag_messages{service,topic,partition}`` for the partitions a
    consumer holds; a partition it no longer holds stops being reported."""

    def __init__(self, metrics: ProcessMetrics, service: str) -> None:
        self._gauge = metrics.gauge(CONSUMER_LAG)
        self._service = service
        self._reported: set[tuple[str, str, str]] = set()

    def client_config(self, interval_s: float = 5.0) -> dict:
        """What to add to the consumer's configuration."""
        return {"statistics.interval.ms": s_to_ms(interval_s), "stats_cb": self.on_statistics}

    def on_statistics(self, raw: str) -> None:
        try:
            current = self.lags(orjson.loads(raw))
        except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
            log.warning("consumer statistics unreadable: %s", exc)
            return
        self.report(current)

    def report(self, current: dict[tuple[str, str, str], int]) -> None:
        """Sets the lag of each (service, topic, partition) held now; drops the others."""
        for labels in self._reported - current.keys():
            self._gauge.remove(*labels)
        for labels, lag in current.items():
            self._gauge.labels(*labels).set(lag)
        self._reported = set(current)

    def lags(self, statistics: dict) -> dict[tuple[str, str, str], int]:
        """Lag per (service, topic, partition) of the partitions being fetched: the end of
        the partition (last stable offset under read_committed) less the committed offset."""
        lags = {}
        for topic, about in statistics.get("topics", {}).items():
            for partition, state in about.get("partitions", {}).items():
                lag = state.get("consumer_lag", -1)
                if partition == "-1" or lag < 0 or state.get("fetch_state") == "none":
                    continue
                lags[(self._service, topic, partition)] = lag
        return lags
