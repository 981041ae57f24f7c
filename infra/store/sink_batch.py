"""What the sink's writer takes: a consumed batch decoded into what each table receives,
and the routes from the smaller topics to their tables."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from dsec.infra.store import rows
from dsec.infra.store.recent_ids import Claim
from dsec.schemas import (
    ActuationCommand,
    ActuationResult,
    DeadLetter,
    FeatureEvent,
    GpuProfileEvent,
    PolicyDecision,
)
from dsec.schemas.alerts import AlertEvent, GpuHealthEvent
from dsec.schemas.feature_columns import feature_events
from dsec.schemas.placement import GpuPersonalityEvent, GpuTopologyEvent, WorkloadAffinityEvent
from dsec.schemas.topics import TopicNames
from dsec.schemas.usage import ProcessUsage

log = logging.getLogger(__name__)
SERVICE = "sink"
RAW_SCOPE = "raw"  # the deduplication scope and token of metric batches, whatever their kinds
UNPREPARABLE = "unpreparable"  # the reason class of a message the sink could not prepare


@dataclass(frozen=True)
class TableRoute:
    table: str
    columns: list[str]
    model: type[BaseModel]
    to_rows: Callable[[Any], list[rows.Row]]
    id_of: Callable[[Any], str]
    id_column: str = "event_id"
    # the events of one message, where a message may hold several (default: one ``model``)
    events_of: Callable[[bytes | None], list[Any]] | None = None


def _event_id(event: Any) -> str:
    return event.event_id


def routes_for(topics: TopicNames) -> dict[str, TableRoute]:
    return {
        topics.features: TableRoute(
            "features", rows.FEATURE_COLUMNS, FeatureEvent, rows.feature_rows, _event_id,
            events_of=feature_events),
        topics.gpu_profiles: TableRoute(
            "gpu_profiles", rows.GPU_PROFILE_COLUMNS, GpuProfileEvent, rows.gpu_profile_rows,
            _event_id),
        topics.actuations: TableRoute(
            "actuations", rows.ACTUATION_COLUMNS, ActuationCommand, rows.actuation_rows,
            lambda command: command.actuation_id, id_column="actuation_id"),
        topics.actuation_results: TableRoute(
            "actuation_results", rows.RESULT_COLUMNS, ActuationResult, rows.result_rows,
            _event_id),
        topics.decisions: TableRoute(
            "policy_decisions", rows.DECISION_COLUMNS, PolicyDecision, rows.decision_rows,
            _event_id),
        topics.dead_letters: TableRoute(
            "dead_letters", rows.DEAD_LETTER_COLUMNS, DeadLetter, rows.dead_letter_rows,
            _event_id),
        topics.alerts: TableRoute(
            "alerts", rows.ALERT_COLUMNS, AlertEvent, rows.alert_rows, _event_id),
        topics.gpu_health: TableRoute(
            "gpu_health", rows.GPU_HEALTH_COLUMNS, GpuHealthEvent, rows.gpu_health_rows,
            _event_id),
        topics.process_usage: TableRoute(
            "process_usage", rows.USAGE_COLUMNS, ProcessUsage, rows.usage_rows, _event_id),
        topics.gpu_personalities: TableRoute(
            "gpu_personalities", rows.PERSONALITY_COLUMNS, GpuPersonalityEvent,
            rows.personality_rows, _event_id),
        topics.workload_affinity: TableRoute(
            "workload_affinity", rows.AFFINITY_COLUMNS, WorkloadAffinityEvent,
            rows.affinity_rows, _event_id),
        topics.gpu_topology: TableRoute(
            "gpu_topology", rows.TOPOLOGY_COLUMNS, GpuTopologyEvent, rows.topology_rows,
            _event_id),
    }


@dataclass(frozen=True)
class Source:
    """Where a stored event came from, to dead-letter it if the store refuses it."""

    topic: str
    partition: int
    offset: int
    value: bytes


@dataclass(frozen=True)
class StoredEvent:
    event_id: str
    source: Source
    rows: list[rows.Row]


@dataclass
class PreparedBatch:
    """A consumed batch, decoded: what each table receives, and where the next one starts.
    Each table's deduplication token hashes the ids of the events it holds; ``claims`` are
    the ids this batch holds in the sink's ``RecentIds``."""

    arrow: dict[str, Any] = field(default_factory=dict)
    events: dict[str, list[StoredEvent]] = field(default_factory=dict)
    raw_sources: dict[str, Source] = field(default_factory=dict)
    # {raw table: [message id of each run of its rows, in row order]}
    raw_messages: dict[str, list[str]] = field(default_factory=dict)
    next_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    tokens: dict[str, Any] = field(default_factory=dict)
    claims: list[Claim] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    unpreparable: int = 0  # of the dead letters, messages the sink could not prepare
    # (topic, partition, offset) of the messages dead-lettered for what the store refused
    rejected: set[tuple[str, int, int]] = field(default_factory=set)

    def token(self, table: str) -> Any:
        return self.tokens.setdefault(table, hashlib.blake2b(digest_size=16))

    def add_dead_letter(self, source: Source, reason: str) -> None:
        """Published by the writer before the batch's offsets are recorded."""
        log.warning("sink: %s@%d:%d dead-lettered: %s", source.topic, source.partition,
                    source.offset, reason)
        self.dead_letters.append(DeadLetter.for_message(
            topic=source.topic, partition=source.partition, offset=source.offset,
            reason=reason, payload=source.value))


@dataclass
class SinkCounters:
    messages: int = 0
    samples: int = 0
    rows_by_table: dict[str, int] = field(default_factory=dict)
    duplicates_skipped: int = 0
    undecodable: int = 0
    insert_retries: int = 0
    inserts_rejected: int = 0
    dead_lettered: int = 0
    dead_letters_unstorable: int = 0
    unpreparable: int = 0  # messages the sink failed on (dead-lettered, the batch went on)
    loop_restarts: int = 0
