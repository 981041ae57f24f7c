"""The sink's ``prepare``: consumed messages decoded and deduplicated into a ``PreparedBatch``.

A message that cannot be prepared is dead-lettered with the reason and the batch goes on
without it; a metric batch the metrics job dead-letters already (undecodable, or outside
the event-time window) is only counted here.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from confluent_kafka import Message

from dsec.infra.observability.metrics import EVENTS_IN, ProcessMetrics
from dsec.infra.store.raw_columns import RawColumnsBuilder
from dsec.infra.store.recent_ids import RecentIds
from dsec.infra.store.sink_batch import (
    RAW_SCOPE,
    SERVICE,
    PreparedBatch,
    SinkCounters,
    Source,
    StoredEvent,
    routes_for,
)
from dsec.schemas import DecodeError, decode
from dsec.schemas.event_times import EventTimeWindow
from dsec.schemas.fast_decode import DecodedBatch, decode_metric_batch
from dsec.schemas.metrics import duplicate_key
from dsec.schemas.topics import TopicNames

log = logging.getLogger(__name__)
RawBatches = list[tuple[Source, DecodedBatch]]


class BatchPreparer:
    def __init__(self, topics: TopicNames, recent: RecentIds, counters: SinkCounters,
                 metrics: ProcessMetrics, event_times: EventTimeWindow) -> None:
        self._metrics_topic = topics.metrics
        self._routes = routes_for(topics)
        self._recent = recent
        self._counters = counters
        self._events_in = metrics.counter(EVENTS_IN)
        self._event_times = event_times

    def prepare(self, messages: Sequence[Message]) -> PreparedBatch:
        """What each table receives of ``messages`` (client errors left out already)."""
        batch = PreparedBatch()
        raw_batches: RawBatches = []
        consumed: dict[str, int] = {}
        for message in messages:
            topic, value = message.topic(), message.value()
            batch.next_offsets[(topic, message.partition())] = message.offset() + 1
            consumed[topic] = consumed.get(topic, 0) + 1
            self._counters.messages += 1
            source = Source(topic, message.partition(), message.offset(), value)
            try:
                if topic == self._metrics_topic:
                    self._add_raw(source, raw_batches, batch)
                else:
                    self._add_event(source, batch)
            except Exception as exc:  # one message never stops the others' storage
                self._unpreparable(batch, source, exc)
        batch.arrow = self._raw_tables(raw_batches, batch)
        for topic, count in consumed.items():
            self._events_in.labels(SERVICE, topic).inc(count)
        return batch

    def _add_event(self, source: Source, batch: PreparedBatch) -> None:
        route = self._routes.get(source.topic)
        if route is None:
            return
        try:
            events = (route.events_of(source.value) if route.events_of is not None
                      else [decode(source.value, route.model)])
        except DecodeError as exc:
            self._counters.undecodable += 1
            log.warning("sink: skipping %s@%d: %s", source.topic, source.offset, exc.reason)
            return
        # A message's events are prepared together or not at all (the store may still
        # refuse one of them: the writer then dead-letters the message once).
        claimed: list[tuple[str, str]] = []
        stored: list[StoredEvent] = []
        try:
            for event in events:
                event_id = route.id_of(event)
                if not self._recent.claim(route.table, event_id):
                    self._counters.duplicates_skipped += 1
                    continue
                claimed.append((route.table, event_id))
                stored.append(StoredEvent(event_id, source, route.to_rows(event)))
        except Exception:
            self._recent.release(claimed)
            raise
        batch.claims.extend(claimed)
        batch.events.setdefault(route.table, []).extend(stored)
        token = batch.token(route.table)
        for event in stored:
            token.update(event.event_id.encode())

    def _add_raw(self, source: Source, raw_batches: RawBatches, batch: PreparedBatch) -> None:
        try:
            decoded = decode_metric_batch(source.value, self._event_times)
        except DecodeError:
            # The metrics job dead-letters these, with the reason; here they are only counted.
            self._counters.undecodable += 1
            return
        RawColumnsBuilder().add(decoded.header, decoded.frames)  # raises where it cannot go in
        batch_id = duplicate_key(decoded.header)
        if not self._recent.claim(RAW_SCOPE, batch_id):
            self._counters.duplicates_skipped += 1
            return
        batch.claims.append((RAW_SCOPE, batch_id))
        raw_batches.append((source, decoded))

    def _raw_tables(self, raw_batches: RawBatches, batch: PreparedBatch) -> dict[str, Any]:
        """One Arrow table per raw table. Should the batches not go together, each is tried
        alone and those that fail are dead-lettered."""
        raw = RawColumnsBuilder()
        for _, decoded in raw_batches:
            raw.add(decoded.header, decoded.frames)
        try:
            tables = raw.tables()
        except Exception:
            raw, kept = RawColumnsBuilder(), []
            for source, decoded in raw_batches:
                alone = RawColumnsBuilder()
                alone.add(decoded.header, decoded.frames)
                try:
                    alone.tables()
                except Exception as exc:
                    self._unpreparable(batch, source, exc)
                    continue
                raw.add(decoded.header, decoded.frames)
                kept.append((source, decoded))
            raw_batches, tables = kept, raw.tables()
        batch.raw_messages = raw.message_ids()
        for source, decoded in raw_batches:
            batch_id = duplicate_key(decoded.header)
            batch.raw_sources[batch_id] = source
            self._counters.samples += decoded.sample_count()
            batch.token(RAW_SCOPE).update(batch_id.encode())
        return tables

    def _unpreparable(self, batch: PreparedBatch, source: Source, exc: Exception) -> None:
        self._counters.unpreparable += 1
        self._counters.dead_lettered += 1
        batch.unpreparable += 1
        batch.add_dead_letter(source, f"the sink could not prepare it: "
                                      f"{type(exc).__name__}: {exc}"[:1000])
