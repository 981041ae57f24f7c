"""The metrics job: validate probe batches (bad ones → dead letters), derive per-worker
features and per-GPU profile contributions, and say what to publish.

No broker here: ``MetricsJob`` takes consumed records and gives the outputs to publish
and the worker states to keep, over a mapping of worker states it is given (the Faust
table in the stream job, a dict in tests). The statistics live in ``stats`` and
``worker_features`` as pure functions. The caller keeps the order that makes a replay
safe: a batch's outputs delivered, then its states saved, then its offsets committed.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass, field, replace

import numpy as np

from dsec.infra.records import Output, Record
from dsec.schemas import (
    DecodeError,
    FeatureEvent,
    GpuProfileEvent,
    WorkerIdentity,
    encode,
    now_ms,
)
from dsec.schemas.cards import CardReport
from dsec.schemas.event_times import EventTimeWindow
from dsec.schemas.fast_decode import decode_metric_batch
from dsec.schemas.feature_columns import pack_feature_events
from dsec.schemas.features import RegimeGrowth
from dsec.schemas.metrics import duplicate_key
from dsec.schemas.topics import TopicNames
from dsec.schemas.units import s_to_ms
from dsec.stream_jobs import card_reports, finite, silence, worker_features
from dsec.stream_jobs.runtime_features import runtime_features
from dsec.stream_jobs.worker_features import FeatureConfig, GpuContribution
from dsec.stream_jobs.worker_state import WorkerState

__all__ = [
    "BatchResult", "JobCounters", "LivenessResult", "MetricsBatch", "MetricsJob",
    "derived_event_id",
]

log = logging.getLogger(__name__)
# A message of feature columns stays well under the broker's default limit (1 MB).
FEATURE_MESSAGE_MAX_BYTES = 512 * 1024


@dataclass
class JobCounters:
    messages_in: int = 0
    samples_in: int = 0
    replayed_skipped: int = 0
    dead_letters: int = 0
    features_out: int = 0
    gpu_profiles_out: int = 0
    card_reports_out: int = 0

    def add(self, other: JobCounters) -> None:
        for name, value in vars(other).items():
            setattr(self, name, getattr(self, name) + value)


def derived_event_id(*parts: object) -> str:
    """A deterministic id: re-deriving the same output after a replay gives the same id."""
    return hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=16).hexdigest()


@dataclass
class BatchResult:
    """What one batch of records gave: ``per_record`` (a dead letter for each record that
    gave one, in the records' order); ``features``, the feature event of each record that
    gave one, in the records' order, then those per GPU of workers on several;
    ``feature_columns``, those events as ``FeatureColumns`` messages, one or more per
    partition of the features topic; ``gpu_profiles`` (the latest contribution per GPU and
    worker), ``card_reports`` (to the card job), and the worker states to save once they
    are out. ``derived``: per worker, the features of each of its records, for telemetry.
    ``counters``: what the batch counted, for the job's counters once it is saved (a batch
    handled again after a failed delivery counts once)."""

    per_record: list[Output] = field(default_factory=list)
    features: list[FeatureEvent] = field(default_factory=list)
    feature_columns: list[Output] = field(default_factory=list)
    gpu_profiles: list[Output] = field(default_factory=list)
    card_reports: list[Output] = field(default_factory=list)
    states: dict[str, WorkerState] = field(default_factory=dict)
    derived: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    recovery_times_s: list[np.ndarray] = field(default_factory=list)
    dead_letter_reasons: list[str] = field(default_factory=list)
    counters: JobCounters = field(default_factory=JobCounters)

    @property
    def outputs(self) -> list[Output]:
        return [*self.per_record, *self.after_records]

    @property
    def after_records(self) -> list[Output]:
        """What ``finish`` adds to the per-record outputs, in the order to publish it."""
        return [*self.feature_columns, *self.gpu_profiles, *self.card_reports]


@dataclass
class LivenessResult:
    """Workers found lost: their feature events, and their states to save once those are
    out. ``overdue``: the states of workers found overdue, or no longer, with nothing to
    publish: to save at once, before any await lets a batch save newer ones.
    ``lost_workers``: how many of the workers held here are lost, these included."""

    outputs: list[Output] = field(default_factory=list)
    states: dict[str, WorkerState] = field(default_factory=dict)
    # the states ``states`` were derived from: a batch may save newer ones meanwhile
    read: dict[str, WorkerState] = field(default_factory=dict)
    overdue: dict[str, WorkerState] = field(default_factory=dict)
    lost_workers: int = 0


def target_tags(identity: WorkerIdentity, state: WorkerState | None) -> dict[str, str]:
    """What policy selectors match on: the worker's labels, its pool and its GPU's model
    (of the GPU it reported last)."""
    tags = dict(identity.labels or {})
    if identity.pool:
        tags["pool"] = identity.pool
    latest = state.latest_gpu() if state is not None else None
    if latest is not None and latest[1]:
        tags["gpu_model"] = latest[1][:128]
    return tags


class MetricsJob:
    def __init__(
        self,
        topics: TopicNames,
        states: MutableMapping[str, WorkerState],
        config: FeatureConfig | None = None,
        event_times: EventTimeWindow | None = None,
        clock_ms: Callable[[], int] = now_ms,
        card_report_interval_s: float = 30.0,
        feature_partition: Callable[[bytes], int] | None = None,
        feature_rows_per_message: int = 1000,
    ) -> None:
        """``states``: worker id -> state. ``event_times``: the sample times the store
        keeps; batches with samples outside it are dead-lettered (the default: the store's
        default window). ``clock_ms``: the wall clock (epoch ms) that stamps each output
        as it is made. ``card_report_interval_s``: how often a worker's membership of its
        cards is told again to the card job while nothing about it changes.
        ``feature_partition``: the features topic's partition of a key, as the producer
        chooses it (None: one partition). A ``FeatureColumns`` message holds the rows of one
        partition only, at most ``feature_rows_per_message``, under its first row's key:
        each row lands where its worker's single event would, and the engine's state for
        the worker with it."""
        self.topics = topics
        self.states = states
        self.config = config or FeatureConfig()
        self.event_times = event_times or EventTimeWindow()
        self.clock_ms = clock_ms
        self.card_report_interval_ms = s_to_ms(card_report_interval_s)
        self.feature_partition = feature_partition
        self.feature_rows_per_message = feature_rows_per_message
        self.counters = JobCounters()
        # partition -> the highest source offset processed here: a worker is judged silent
        # only where everything on its partition has been read.
        self.processed_through: dict[int, int] = {}

    def start_batch(self, batch_ms: int) -> MetricsBatch:
        """A batch to feed one record at a time, for a caller that publishes as it goes."""
        return MetricsBatch(self, batch_ms)

    def process(self, records: Iterable[Record], batch_ms: int) -> BatchResult:
        """One batch at once; ``batch_ms``: the wall-clock time (epoch ms) it is taken at,
        which bounds the sample times accepted and times the heartbeats."""
        batch = self.start_batch(batch_ms)
        for record in records:
            batch.add(record)
        result = batch.finish()
        self.counters.add(result.counters)
        return result

    def save(self, states: dict[str, WorkerState]) -> None:
        """Keeps the states of a batch or a liveness check; call once its outputs are out."""
        for worker, state in states.items():
            self.states[worker] = state

    def save_batch(self, result: BatchResult) -> None:
        """Keeps a batch's states and adds what it counted; call once its outputs are out
        (for a batch from ``start_batch``: ``process`` counts its batch itself)."""
        self.save(result.states)
        self.counters.add(result.counters)

    def save_lost(self, result: LivenessResult) -> None:
        """Keeps the lost workers' states once their events are out, except where a batch
        saved a newer state in the meantime (the worker spoke again: that state wins)."""
        for worker, state in result.states.items():
            current = self.states.get(worker)
            read = result.read.get(worker)
            if current is read or current == read:
                self.states[worker] = state

    def check_liveness(
        self, now_ms: int, partition_end: Callable[[int], int | None],
    ) -> LivenessResult:
        """``partition_end``: a metrics partition's end offset as last fetched (None where
        unknown or not assigned here).

        A worker's silence is weighed against how far the stream has come over every
        worker held here, from the states saved: those of a batch still being worked
        through do not move it, so a worker whose heartbeat waits in that batch is not
        judged against others already read from it."""
        result = LivenessResult()
        progress_ms = silence.stream_progress_ms(
            (state.heartbeat.last_event_ms for state in self.states.values()), now_ms)
        for worker, state in list(self.states.items()):
            caught_up = self._caught_up(state.partition, partition_end)
            new_state, lost = worker_features.liveness(state, now_ms, self.config, caught_up,
                                                       progress_ms)
            if lost is None:
                result.lost_workers += state.heartbeat.lost
                if new_state is not state:
                    result.overdue[worker] = new_state
                continue
            result.lost_workers += 1
            assert state.identity is not None  # a state with a heartbeat has its identity
            event_id = derived_event_id("lost", worker, state.heartbeat.last_seen_ms)
            result.outputs.append(self.feature_output(
                self.feature_event(state.identity, lost, event_id, state=state)))
            result.states[worker] = new_state
            result.read[worker] = state
            self.counters.features_out += 1
            log.warning("worker %s lost: silent for %.1f s", worker, lost["heartbeat_age_s"])
        return result

    def _caught_up(self, partition: int | None,
                   partition_end: Callable[[int], int | None]) -> bool:
        """Every message on the partition, up to its end as last fetched, is processed."""
        if partition is None:
            return False
        end = partition_end(partition)
        return end is not None and self.processed_through.get(partition, -1) >= end - 1

    def feature_event(self, identity: WorkerIdentity, values: dict[str, float],
                      event_id: str, tags: dict[str, str] | None = None,
                      state: WorkerState | None = None, gpu_uuid: str | None = None,
                      window: str = "rolling") -> FeatureEvent:
        """``state``: the worker's, for the model of its GPU. ``gpu_uuid``: the GPU the
        event is about; by default the GPU the worker sampled last."""
        latest = state.latest_gpu() if state is not None else None
        if gpu_uuid is None and latest is not None:
            gpu_uuid = latest[0]
        return FeatureEvent(event_id=event_id, event_time_ms=self.clock_ms(),
                            identity=identity, gpu_uuid=gpu_uuid, window=window,
                            features=values,
                            tags={**target_tags(identity, state), **(tags or {})})

    def feature_output(self, event: FeatureEvent) -> Output:
        """One feature event on its own, keyed by its worker."""
        return Output(self.topics.features, event.identity.worker_id.encode(), event)

    def feature_columns(self, events: list[FeatureEvent]) -> list[Output]:
        """``events`` as ``FeatureColumns`` messages, rows in order within each partition."""
        by_partition: dict[int, list[FeatureEvent]] = {}
        partition_of = self.feature_partition
        for event in events:
            partition = (partition_of(event.identity.worker_id.encode())
                         if partition_of is not None else 0)
            by_partition.setdefault(partition, []).append(event)
        outputs: list[Output] = []
        step = self.feature_rows_per_message
        for group in by_partition.values():
            for start in range(0, len(group), step):
                self._pack(group[start:start + step], outputs)
        return outputs

    def _pack(self, rows: list[FeatureEvent], outputs: list[Output]) -> None:
        """``rows`` as one message, or as two halves where one would pass
        ``FEATURE_MESSAGE_MAX_BYTES`` (long tags on many rows)."""
        message_id = derived_event_id("feature-columns", *(event.event_id for event in rows))
        message = pack_feature_events(rows, message_id, self.clock_ms())
        value = encode(message)
        if len(value) > FEATURE_MESSAGE_MAX_BYTES and len(rows) > 1:
            half = len(rows) // 2
            self._pack(rows[:half], outputs)
            self._pack(rows[half:], outputs)
            return
        outputs.append(Output(self.topics.features, rows[0].identity.worker_id.encode(),
                              message, value))

    def dead_letter_output(self, record: Record, reason: str) -> Output:
        return Output(self.topics.dead_letters, record.topic.encode(),
                      record.dead_letter(reason))


class MetricsBatch:
    """One batch under way: records in one at a time, each giving at most one output to
    publish at once; ``finish`` gives the rest."""

    def __init__(self, job: MetricsJob, batch_ms: int) -> None:
        self._job = job
        self._batch_ms = batch_ms
        self._result = BatchResult()
        self._gpus: dict[tuple[str, str], tuple[WorkerIdentity, GpuContribution, Record]] = {}
        self._per_gpu: dict[tuple[str, str], FeatureEvent] = {}

    def add(self, record: Record) -> Output | None:
        """The record's dead letter, to publish at once, if it gives one."""
        job, result = self._job, self._result
        counters = result.counters
        counters.messages_in += 1
        if record.offset > job.processed_through.get(record.partition, -1):
            job.processed_through[record.partition] = record.offset
        try:
            decoded = decode_metric_batch(record.value, job.event_times, self._batch_ms)
        except DecodeError as exc:
            return self._dead_letter(record, exc.reason)
        except Exception as exc:  # a decoder's own failure refuses the message, not the job
            return self._dead_letter(
                record, f"invalid MetricBatch: undecodable: {type(exc).__name__}: {exc}")
        batch, frames = decoded.header, decoded.frames
        worker = batch.identity.worker_id
        counters.samples_in += decoded.sample_count()
        state = result.states.get(worker) or job.states.get(worker) or WorkerState()
        update, problem = finite.checked_update(
            state, frames, record.partition, record.offset, self._batch_ms, job.config,
            duplicate_key(batch), batch.identity)
        if problem is not None:
            return self._dead_letter(record, problem)
        if update.skipped:
            counters.replayed_skipped += 1
            return None
        if "recovery" in frames:
            result.recovery_times_s.append(frames["recovery"]["recovery_time_s"])
        if "runtime" in frames:
            update.features.update(runtime_features(frames["runtime"]))
        result.states[worker] = self._tell_cards(update.state, batch.gpu_uuid, update.gpus,
                                                 record)
        for contribution in update.gpus:
            self._gpus[(contribution.gpu_uuid, worker)] = (batch.identity, contribution, record)
        for uuid, values in update.gpu_features.items():
            model = update.state.gpus[uuid].model
            self._per_gpu[(uuid, worker)] = job.feature_event(
                batch.identity, values,
                derived_event_id("gpu-features", uuid, worker, record.partition, record.offset),
                {"gpu_model": model[:128]} if model else None,
                gpu_uuid=uuid, window=worker_features.GPU_WINDOW)
        if not update.features:
            return None
        # One feature event per input message, with an id derived from it.
        event_id = derived_event_id("features", worker, record.partition, record.offset)
        result.features.append(job.feature_event(batch.identity, update.features, event_id,
                                                 update.tags, update.state))
        result.derived.setdefault(worker, []).append(update.features)
        counters.features_out += 1
        return None

    def _tell_cards(self, state: WorkerState, named: str | None,
                    contributions: list[GpuContribution], record: Record) -> WorkerState:
        """The worker's state with its cards as told to the card job in this batch."""
        job = self._job
        assert state.identity is not None  # an update always leaves the identity
        readings = {c.gpu_uuid: state.gpus[c.gpu_uuid].throttled for c in contributions}
        cards, news = card_reports.card_news(
            state.cards, [named] if named else [], readings, self._batch_ms,
            job.card_report_interval_ms)
        for item in news:
            report = CardReport(
                event_id=derived_event_id("card-report", item.gpu_uuid,
                                          state.identity.worker_id, record.partition,
                                          record.offset),
                event_time_ms=self._batch_ms, gpu_uuid=item.gpu_uuid,
                identity=state.identity, reports_card=item.reports_card,
                throttled=item.throttled)
            self._result.card_reports.append(
                Output(job.topics.gpu_cards, item.gpu_uuid.encode(), report))
        self._result.counters.card_reports_out += len(news)
        return replace(state, cards=cards) if news else state

    def _dead_letter(self, record: Record, reason: str) -> Output:
        output = self._job.dead_letter_output(record, reason)
        self._result.counters.dead_letters += 1
        self._result.per_record.append(output)
        self._result.dead_letter_reasons.append(reason)
        return output

    def finish(self) -> BatchResult:
        topic = self._job.topics.gpu_profiles
        for (uuid, worker), (identity, contribution, record) in self._gpus.items():
            profile = GpuProfileEvent(
                event_id=derived_event_id("gpu", uuid, worker, record.partition, record.offset),
                event_time_ms=self._job.clock_ms(),
                gpu_uuid=uuid, gpu_model=contribution.gpu_model, identity=identity,
                regimes={name: RegimeGrowth(delta_bytes=d_bytes, delta_s=d_s)
                         for name, (d_bytes, d_s) in contribution.regimes.items()},
                thermal_throttle_events=contribution.thermal_throttle_events,
                bandwidth_jitter=contribution.bandwidth_jitter,
                samples=contribution.samples,
            )
            self._result.gpu_profiles.append(Output(topic, f"{uuid}/{worker}".encode(), profile))
        self._result.counters.gpu_profiles_out += len(self._gpus)
        self._result.features.extend(self._per_gpu.values())
        self._result.counters.features_out += len(self._per_gpu)
        self._result.feature_columns = self._job.feature_columns(self._result.features)
        return self._result
