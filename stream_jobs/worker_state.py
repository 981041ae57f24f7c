"""One worker's feature state as the metrics job keeps it between messages: typed records,
and their bytes in the worker-state table.

The records are frozen and their lists are replaced, never changed in place: an update
that is refused leaves the state it started from as it was.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from dsec.schemas import WorkerIdentity

__all__ = [
    "CardSeen", "CudaDevice", "EpisodeWindow", "GpuState", "Heartbeat", "Recoveries",
    "RegimeGrowthTotals", "StepWindow", "SyncWindow", "WorkerState", "WorkerStateTable",
]

# The layout of the table's bytes; entries without it are the plain dicts of before.
FORMAT = 2
# How many of a worker's source offsets per partition, and of its batch ids, it remembers.
RECENT_OFFSETS = 64
RECENT_BATCHES = 64


@dataclass(frozen=True, slots=True)
class EpisodeWindow:
    """The last episodes (rewards over two reward windows: the window and the one before)."""

    rewards: list[float] = field(default_factory=list)
    reward_times_ms: list[int] = field(default_factory=list)
    lengths_steps: list[int] = field(default_factory=list)
    episodes_total: int = 0
    same_end_streak_episodes: int = 0
    last_end_reason: str | None = None
    # The worker's own recent endings, oldest first ("" for an episode without a reason):
    # what a streak's ending is judged rare against.
    end_reasons: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class StepWindow:
    steps_total: int = 0
    grad_norm_steps: list[int] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    grad_nonfinite_flags: list[int] = field(default_factory=list)
    loss_nonfinite_flags: list[int] = field(default_factory=list)
    # Time covered by step timing since first seen (each step sample's mean step time
    # times the steps since the sample before), and the last sampled step.
    step_time_s_total: float = 0.0
    last_sampled_step: int | None = None


@dataclass(frozen=True, slots=True)
class SyncWindow:
    latency_ms: list[float] = field(default_factory=list)
    sizes_bytes: list[int] = field(default_factory=list)
    ok_flags: list[int] = field(default_factory=list)
    times_ms: list[int] = field(default_factory=list)
    syncs_total: int = 0
    syncs_failed_total: int = 0


@dataclass(frozen=True, slots=True)
class Recoveries:
    """The worker's resumes since first seen: all of them, and those from a snapshot with
    the time they took in all."""

    total: int = 0
    from_snapshot: int = 0
    from_snapshot_s: float = 0.0


@dataclass(frozen=True, slots=True)
class RegimeGrowthTotals:
    delta_bytes: float = 0.0
    delta_s: float = 0.0


@dataclass(frozen=True, slots=True)
class GpuState:
    """One GPU of the worker: its last sample (the start of the next growth interval), the
    memory growth so far per episode-length regime, and its recent memory readings."""

    model: str
    last_time_ms: int
    last_used_bytes: int
    last_regime: str
    growth_by_regime: dict[str, RegimeGrowthTotals] = field(default_factory=dict)
    throttled: bool = False
    throttle_onset_count: int = 0
    sample_count: int = 0
    recent_times_ms: list[int] = field(default_factory=list)
    recent_used_bytes: list[int] = field(default_factory=list)
    # The last readings of the rest, for the worker's features over all its GPUs.
    process_used_bytes: int | None = None
    temperature_c: float | None = None
    utilisation_pct: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {**_fields(self), "growth_by_regime": {
            name: [g.delta_bytes, g.delta_s] for name, g in self.growth_by_regime.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GpuState:
        growth = {name: RegimeGrowthTotals(*pair)
                  for name, pair in data.get("growth_by_regime", {}).items()}
        return cls(**{**data, "growth_by_regime": growth})


@dataclass(frozen=True, slots=True)
class CudaDevice:
    """The last ``torch.cuda.memory_stats`` of one device the worker's process uses."""

    time_ms: int
    allocated_bytes: int
    reserved_bytes: int
    fragmentation_ratio: float = 0.0
    oom_count: int = 0


@dataclass(frozen=True, slots=True)
class CardSeen:
    """A card the worker is on, as last told to the card job: when, and what it said."""

    reported_ms: int
    reports_card: bool = False
    throttled: bool = False


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """``last_seen_ms``: the wall-clock time (epoch ms) the job last read a heartbeat.
    ``last_event_ms``: the newest heartbeat event time the worker sent (its clock).
    ``overdue_since_ms``: since when (job's clock) the worker has been silent past the
    timeout in this silence (``silence.judge_silence``).
    ``last_step``, ``step_changed_ms``, ``stalled_beats``: the step count the last one
    carried, when that count last moved, heartbeats since without a step
    (``step_progress``)."""

    last_seen_ms: int | None = None
    interval_s: float = 5.0
    lost: bool = False
    last_step: int | None = None
    step_changed_ms: int | None = None
    stalled_beats: int = 0
    last_event_ms: int | None = None
    overdue_since_ms: int | None = None


@dataclass(frozen=True, slots=True)
class WorkerState:
    """``recent_offsets``: per source partition, the last offsets counted (see
    ``worker_features.already_seen``); ``bandwidth_jitter``: the last gradient-sync
    bandwidth jitter, carried into GPU profiles of batches without syncs."""

    identity: WorkerIdentity | None = None
    partition: int | None = None
    recent_offsets: dict[int, list[int]] = field(default_factory=dict)
    recent_batch_ids: list[str] = field(default_factory=list)
    episodes: EpisodeWindow = field(default_factory=EpisodeWindow)
    steps: StepWindow = field(default_factory=StepWindow)
    syncs: SyncWindow = field(default_factory=SyncWindow)
    gpus: dict[str, GpuState] = field(default_factory=dict)
    bandwidth_jitter: float = 0.0
    heartbeat: Heartbeat = field(default_factory=Heartbeat)
    cuda_devices: dict[int, CudaDevice] = field(default_factory=dict)
    cards: dict[str, CardSeen] = field(default_factory=dict)
    recoveries: Recoveries = field(default_factory=Recoveries)

    def latest_gpu(self) -> tuple[str, str] | None:
        """(UUID, model) of the GPU sampled last, if any."""
        if not self.gpus:
            return None
        uuid, gpu = max(self.gpus.items(), key=lambda item: item[1].last_time_ms)
        return uuid, gpu.model

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "identity": None if self.identity is None else self.identity.model_dump(),
            "partition": self.partition,
            "recent_offsets": {str(p): offsets for p, offsets in self.recent_offsets.items()},
            "recent_batch_ids": self.recent_batch_ids,
            "episodes": _fields(self.episodes),
            "steps": _fields(self.steps),
            "syncs": _fields(self.syncs),
            "gpus": {uuid: gpu.to_json() for uuid, gpu in self.gpus.items()},
            "bandwidth_jitter": self.bandwidth_jitter,
            "heartbeat": _fields(self.heartbeat),
            "cuda_devices": {str(index): _fields(device)
                             for index, device in self.cuda_devices.items()},
            "cards": {uuid: _fields(card) for uuid, card in self.cards.items()},
            "recoveries": _fields(self.recoveries),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkerState:
        if data.get("format") != FORMAT:
            data = _from_dict_of_before(data)
        identity = data.get("identity")
        return cls(
            identity=None if identity is None else WorkerIdentity.model_validate(identity),
            partition=data.get("partition"),
            recent_offsets={int(p): offsets for p, offsets in data["recent_offsets"].items()},
            recent_batch_ids=data["recent_batch_ids"],
            episodes=EpisodeWindow(**data["episodes"]),
            steps=StepWindow(**data["steps"]),
            syncs=SyncWindow(**data["syncs"]),
            gpus={uuid: GpuState.from_json(gpu) for uuid, gpu in data["gpus"].items()},
            bandwidth_jitter=data["bandwidth_jitter"],
            heartbeat=Heartbeat(**data["heartbeat"]),
            cuda_devices={int(index): CudaDevice(**device)
                          for index, device in data.get("cuda_devices", {}).items()},
            cards={uuid: CardSeen(**card) for uuid, card in data.get("cards", {}).items()},
            recoveries=Recoveries(**data.get("recoveries", {})),
        )

    def to_bytes(self) -> bytes:
        return orjson.dumps(self.to_json())

    @classmethod
    def from_bytes(cls, raw: bytes) -> WorkerState:
        return cls.from_json(orjson.loads(raw))


def _fields(record: Any) -> dict[str, Any]:
    return {name: getattr(record, name) for name in record.__dataclass_fields__}


def _from_dict_of_before(old: dict[str, Any]) -> dict[str, Any]:
    """The layout of a worker-state entry written as a plain dict (string keys, no
    ``format``), so that a job upgraded in place keeps its windows and replay memory."""
    offsets = old.get("recent_offsets")
    if offsets is None:
        # Only a high-water mark: a full window ending at it counts everything up to it.
        offsets = {p: list(range(mark - RECENT_OFFSETS + 1, mark + 1))
                   for p, mark in old.get("offsets", {}).items()}
    return {
        "identity": old.get("identity"), "partition": old.get("partition"),
        "recent_offsets": offsets, "recent_batch_ids": old.get("recent_batches", []),
        "episodes": {
            "rewards": old.get("rewards", []), "reward_times_ms": old.get("reward_times_ms", []),
            "lengths_steps": old.get("lengths", []),
            "episodes_total": old.get("episodes_total", 0),
            "same_end_streak_episodes": old.get("same_end_streak", 0),
            "last_end_reason": old.get("last_end_reason")},
        "steps": {
            "steps_total": old.get("steps_total", 0), "grad_norm_steps": old.get("grad_steps", []),
            "grad_norms": old.get("grad_norms", []),
            "grad_nonfinite_flags": old.get("grad_nonfinite", []),
            "loss_nonfinite_flags": old.get("loss_nonfinite", [])},
        "syncs": {
            "latency_ms": old.get("sync_latency_ms", []), "sizes_bytes": old.get("sync_bytes", []),
            "ok_flags": old.get("sync_ok", []), "times_ms": old.get("sync_times_ms", [])},
        "gpus": {uuid: {
            "model": gpu["model"], "last_time_ms": gpu["last"][0],
            "last_used_bytes": gpu["last"][1], "last_regime": gpu["last"][2],
            "growth_by_regime": gpu.get("growth", {}), "throttled": gpu.get("throttled", False),
            "throttle_onset_count": gpu.get("throttle_onsets", 0),
            "sample_count": gpu.get("samples", 0),
            "recent_times_ms": gpu.get("recent_times_ms", []),
            "recent_used_bytes": gpu.get("recent_used", [])}
            for uuid, gpu in old.get("gpus", {}).items()},
        "bandwidth_jitter": old.get("last_jitter", 0.0),
        "heartbeat": {"last_seen_ms": old.get("last_heartbeat_ms"),
                      "interval_s": old.get("heartbeat_interval_s", 5.0),
                      "lost": bool(old.get("lost", False))},
    }


class WorkerStateTable(MutableMapping[str, WorkerState]):
    """Worker states by worker id over a table of bytes keyed by the worker id's bytes (as
    on the metrics topic, so the changelog partition is the one the worker's events are on).

    The state last written or read for a worker is kept beside its bytes and handed back
    while the table still holds those very bytes: the job reads each of its workers once a
    batch, and decoding them all again would cost more than the features of a small batch.
    The states are frozen, so sharing them is safe."""

    def __init__(self, table: MutableMapping[bytes, bytes]) -> None:
        self._table = table
        self._decoded: dict[bytes, tuple[bytes, WorkerState]] = {}

    def _state(self, key: bytes, raw: bytes) -> WorkerState:
        cached = self._decoded.get(key)
        if cached is not None and cached[0] is raw:
            return cached[1]
        state = WorkerState.from_bytes(raw)
        self._decoded[key] = (raw, state)
        return state

    def __getitem__(self, worker: str) -> WorkerState:
        key = worker.encode()
        return self._state(key, self._table[key])

    def get(self, worker: str, default: Any = None) -> Any:  # one lookup, not two
        key = worker.encode()
        raw = self._table.get(key)
        if raw is None:
            self._decoded.pop(key, None)
            return default
        return self._state(key, raw)

    def __setitem__(self, worker: str, state: WorkerState) -> None:
        key, raw = worker.encode(), state.to_bytes()
        self._table[key] = raw
        self._decoded[key] = (raw, state)

    def __delitem__(self, worker: str) -> None:
        key = worker.encode()
        del self._table[key]
        self._decoded.pop(key, None)

    def __iter__(self) -> Iterator[str]:
        keys = list(self._table)
        # Workers gone from the table (their partition taken away) leave the cache too.
        for gone in self._decoded.keys() - set(keys):
            del self._decoded[gone]
        return (key.decode() for key in keys)

    def __len__(self) -> int:
        return len(self._table)
