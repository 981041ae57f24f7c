"""A batch of feature events as columns: what the engine evaluates.

One row per event, in order: the row's target (``job|worker``), event time, pool and
scope, and per feature name a float column that is NaN where the row's event did not
carry the feature (a carried value is always finite). The event itself, with its tags and
identity, is made only for the rows that fire or need the state machine's full rules.

``from_events`` takes decoded events to columns in one pass; ``from_rows`` takes a
stream job's ``FeatureColumns`` message as it decoded, and ``packed`` columns a producer
already has (a benchmark), with no event object per row; ``concat`` joins batches in
order.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from dsec.policy_engine.jitter import target_hash
from dsec.schemas import FeatureEvent, WorkerIdentity
from dsec.schemas.feature_columns import FeatureRows, spread

__all__ = ["FeatureBatch", "TargetSlots"]


def _target(identity: WorkerIdentity) -> str:
    return f"{identity.job_id}|{identity.worker_id}"


@dataclass
class FeatureBatch:
    targets: list[str]
    event_times_ms: np.ndarray
    features: dict[str, np.ndarray]
    pools: list[str | None]
    # Rows whose event describes one worker (not a pool or a job).
    worker_scope: np.ndarray
    make_event: Callable[[int], FeatureEvent] = field(repr=False)

    def __len__(self) -> int:
        return len(self.targets)

    def event(self, row: int) -> FeatureEvent:
        return self.make_event(row)

    def take(self, rows: np.ndarray) -> FeatureBatch:
        """Those rows, in the order given, as a batch of their own."""
        picked = rows.tolist()
        make_event = self.make_event
        return FeatureBatch(
            targets=[self.targets[row] for row in picked],
            event_times_ms=self.event_times_ms[rows],
            features={name: column[rows] for name, column in self.features.items()},
            pools=[self.pools[row] for row in picked],
            worker_scope=self.worker_scope[rows],
            make_event=lambda row: make_event(picked[row]),
        )

    @classmethod
    def from_events(cls, events: Sequence[FeatureEvent]) -> FeatureBatch:
        rows = len(events)
        columns = spread([event.features for event in events], float("nan"))
        return cls(
            targets=[_target(e.identity) for e in events],
            event_times_ms=np.fromiter((e.event_time_ms for e in events), np.int64, rows),
            features={name: np.asarray(values, dtype=np.float64)
                      for name, values in columns.items()},
            pools=[e.target_pool() for e in events],
            worker_scope=np.fromiter((e.scope == "worker" for e in events), bool, rows),
            make_event=events.__getitem__,
        )

    @classmethod
    def from_rows(cls, rows: FeatureRows) -> FeatureBatch:
        return cls(
            targets=[f"{job}|{worker}"
                     for job, worker in zip(rows.job_ids, rows.worker_ids, strict=True)],
            event_times_ms=np.asarray(rows.event_times_ms, dtype=np.int64),
            features=dict(rows.features),
            pools=rows.target_pools(),
            worker_scope=np.ones(len(rows), dtype=bool),
            make_event=rows.event,
        )

    @classmethod
    def concat(cls, batches: Sequence[FeatureBatch]) -> FeatureBatch:
        """The batches' rows, in order, as one batch (a feature a batch lacks is NaN there)."""
        if len(batches) == 1:
            return batches[0]
        sizes = [len(batch) for batch in batches]
        starts = np.cumsum([0, *sizes]).tolist()
        names = dict.fromkeys(name for batch in batches for name in batch.features)
        features = {}
        for name in names:
            features[name] = np.concatenate([
                batch.features[name] if name in batch.features else np.full(size, np.nan)
                for batch, size in zip(batches, sizes, strict=True)])

        def make_event(row: int) -> FeatureEvent:
            index = bisect_right(starts, row) - 1
            return batches[index].event(row - starts[index])

        return cls(
            targets=[target for batch in batches for target in batch.targets],
            event_times_ms=np.concatenate([batch.event_times_ms for batch in batches]),
            features=features,
            pools=[pool for batch in batches for pool in batch.pools],
            worker_scope=np.concatenate([batch.worker_scope for batch in batches]),
            make_event=make_event,
        )

    @classmethod
    def packed(cls, job_ids: Sequence[str], worker_ids: Sequence[str],
               node_ids: Sequence[str], event_times_ms: np.ndarray,
               features: Mapping[str, np.ndarray],
               tags: Sequence[dict[str, str]] | None = None) -> FeatureBatch:
        """Worker-scope rows from columns; ``features`` NaN where a row carries nothing."""
        rows = len(worker_ids)
        times = np.asarray(event_times_ms, dtype=np.int64)

        def make_event(row: int) -> FeatureEvent:
            return FeatureEvent(
                identity=WorkerIdentity(job_id=job_ids[row], worker_id=worker_ids[row],
                                        node_id=node_ids[row]),
                event_time_ms=int(times[row]),
                features={name: float(column[row]) for name, column in features.items()
                          if column[row] == column[row]},
                tags=tags[row] if tags is not None else {},
            )

        return cls(
            targets=[f"{job}|{worker}" for job, worker in zip(job_ids, worker_ids, strict=True)],
            event_times_ms=times,
            features={name: np.asarray(column, dtype=np.float64)
                      for name, column in features.items()},
            pools=[(t or {}).get("pool") or None for t in tags] if tags is not None
            else [None] * rows,
            worker_scope=np.ones(rows, dtype=bool),
            make_event=make_event,
        )


class TargetSlots:
    """A row number per target, for the engine's column state: slots are given in order of
    first sight and never reused."""

    def __init__(self) -> None:
        self._slot_of: dict[str, int] = {}
        self.targets: list[str] = []
        self._hashes = np.zeros(0, dtype=np.uint64)  # target_hash per slot, made when asked

    def __len__(self) -> int:
        return len(self.targets)

    def existing(self, targets: Iterable[str]) -> np.ndarray:
        """The slots of those of ``targets`` that have one (none is added)."""
        slot_of = self._slot_of
        return np.fromiter((slot_of[target] for target in targets if target in slot_of),
                           dtype=np.int64)

    def hashes(self, slots: np.ndarray) -> np.ndarray:
        """The ``target_hash`` of each slot's target."""
        known = self._hashes.size
        if known < len(self.targets):
            added = [target_hash(target) for target in self.targets[known:]]
            self._hashes = np.concatenate([self._hashes, np.asarray(added, dtype=np.uint64)])
        return self._hashes[slots]

    def slots(self, targets: Sequence[str]) -> np.ndarray:
        slot_of = self._slot_of
        found = [slot_of.get(target, -1) for target in targets]
        if -1 in found:
            for row, slot in enumerate(found):
                if slot == -1:
                    target = targets[row]
                    slot = slot_of.get(target)
                    if slot is None:
                        slot = slot_of[target] = len(self.targets)
                        self.targets.append(target)
                    found[row] = slot
        return np.asarray(found, dtype=np.int64)
