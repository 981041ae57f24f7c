"""Neutral telemetry with labelled faults, for the detection bench.

A trace is a fleet of simulated workers of one workload shape (``detection_workloads``)
and a seed: episodes of the shape's lengths and endings, steps with their losses and
gradient norms, a gradient sync per step, CUDA memory every second, NVML samples every
second from the processes that sample their card, a heartbeat every 5 s. One fault of
each class is drawn per seed (its target and onset at random, its size from a range):

- ``memory_leak``: the target's own device memory grows from the onset;
- ``stuck_episode``: the target's episodes end early, the same rare way, from the onset;
- ``card_degraded``: a card throttles for heat for a while; every worker on it is a target;
- ``nan_burst``: a few steps of the target with NaN/Inf loss and gradients at the onset;
- ``variance_jump``: the spread of the target's returns grows several-fold from the onset.

Each label says when the fault began (``onset_ms``), when the signal its policy is meant
to see first exists (``signal_ms``: the memory past the ceiling, the third stuck episode
ended, the first throttled sample, the first NaN step, the first episode after the jump),
and until when a firing on its targets counts as detecting it (``end_ms``).

Documents are the probe's wire form (a ``MetricBatch`` as JSON, columns as lists), made
as they are asked for, interval by interval, so that a replay in real time generates as
it goes.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from dsec.bench.detection_workloads import FAULT_CLASSES, SHAPES, WorkloadShape
from dsec.schemas.base import SCHEMA_VERSION

__all__ = ["CEILING_BYTES", "DetectionTrace", "FaultLabel", "TraceSpec"]

GIB = 1 << 30
CEILING_BYTES = 12 * GIB  # elastic-memory-quota's default ceiling
CONTEXT_BYTES = 512 << 20  # what NVML counts for a process beyond its allocator's bytes
THERMAL = 0x20
HEARTBEAT_INTERVAL_S = 5.0
# How long after a fault's end a firing on its targets still counts as its detection.
GRACE_MS = 30_000


@dataclass(frozen=True)
class TraceSpec:
    shape: str
    seed: int
    workers: int = 16
    duration_s: float = 240.0
    faults: tuple[str, ...] = FAULT_CLASSES
    onset_window_s: tuple[float, float] = (30.0, 120.0)

    @property
    def job_id(self) -> str:
        return f"det-{self.shape}-{self.seed}"


@dataclass
class FaultLabel:
    fault_class: str
    targets: tuple[str, ...]
    onset_ms: int
    end_ms: int
    signal_ms: int | None = None
    detail: dict[str, float | str] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"class": self.fault_class, "targets": list(self.targets),
                "onset_ms": self.onset_ms, "signal_ms": self.signal_ms, "end_ms": self.end_ms,
                "detail": self.detail}


@dataclass
class _Card:
    uuid: str
    node: str
    workers: list[str]
    throttled_from_ms: int | None = None
    throttled_until_ms: int | None = None

    def throttled(self, t_ms: int) -> bool:
        return (self.throttled_from_ms is not None and self.throttled_until_ms is not None
                and self.throttled_from_ms <= t_ms < self.throttled_until_ms)


@dataclass
class _Faults:
    """One worker's faults: what the simulation reads, set when the faults are drawn."""

    leak_from_ms: int | None = None
    leak_bytes_per_s: float = 0.0
    stuck_from_ms: int | None = None
    stuck_reason: str = ""
    nan_at_ms: int | None = None
    nan_steps: int = 0
    jump_from_ms: int | None = None
    jump_std_factor: float = 1.0


class _Worker:
    def __init__(self, trace: DetectionTrace, index: int, card: _Card,
                 samples_nvml: bool) -> None:
        self.trace, self.shape = trace, trace.shape
        self.worker_id = f"{trace.spec.shape}-{trace.spec.seed}-w{index:02d}"
        self.identity = {"job_id": trace.spec.job_id, "worker_id": self.worker_id,
                         "node_id": card.node}
        self.card = card
        self.samples_nvml = samples_nvml
        self.rng = np.random.default_rng(_seed(trace.spec, "worker", index))
        # One generator per signal: what each draws does not depend on how the trace is
        # cut into intervals (a replay's history, the gap while it drains, then 1 s ticks),
        # so a live replay sends the values an offline run sees.
        self.episode_rng = np.random.default_rng(_seed(trace.spec, "episodes", index))
        self.gpu_rng = np.random.default_rng(_seed(trace.spec, "gpu", index))
        self.faults = _Faults()
        self.step = 0
        self.episode = 0
        self.next_step_ms: int | None = None
        self.episode_end_ms: int | None = None
        self.heartbeat_offset_ms = int(self.rng.integers(0, 5000))
        self.memory_jitter = float(self.rng.normal(0.0, 0.02))
        self.reward_drift_per_s = float(self.rng.normal(0.0, self.shape.reward_std / 1200))
        self.nan_left = 0
        self.stuck_episodes_seen = 0
        self.messages = 0

    # -- the worker's signals ----------------------------------------------------------
    def own_memory_bytes(self, t_ms: int) -> int:
        own = self.shape.own_memory_bytes * (1.0 + self.memory_jitter) * (
            1.0 + 0.003 * math.sin(t_ms / 7_000.0))
        if self.faults.leak_from_ms is not None and t_ms >= self.faults.leak_from_ms:
            own += self.faults.leak_bytes_per_s * (t_ms - self.faults.leak_from_ms) / 1000.0
        return int(own)

    def _episode_length_s(self) -> float:
        return float(self.shape.episode_s_median * math.exp(
            self.episode_rng.normal(0.0, self.shape.episode_s_sigma)))

    def _steps(self, a_ms: int, b_ms: int, out: dict) -> None:
        rate = self.shape.steps_per_s * (0.7 if self.card.throttled(a_ms) else 1.0)
        if self.next_step_ms is None:
            self.next_step_ms = a_ms + int(self.rng.uniform(0, 1000 / rate))
        faults = self.faults
        while self.next_step_ms < b_ms:
            t = self.next_step_ms
            if faults.nan_at_ms is not None and t >= faults.nan_at_ms and self.nan_left == 0 \
                    and faults.nan_steps:
                self.nan_left, faults.nan_steps = faults.nan_steps, 0
                self.trace.signal("nan_burst", self.worker_id, t)
            bad = self.nan_left > 0
            self.nan_left -= bad
            spike = 3.0 if self.step % 32 == 0 else 1.0  # a fresh rollout's first update
            norm = 2.0 * spike * math.exp(self.rng.normal(0.0, self.shape.noise))
            steps = out.setdefault("step", _columns("event_time_ms", "step", "loss",
                                                    "grad_norm", "loss_nonfinite",
                                                    "grad_nonfinite", "grad_norm_source"))
            steps["event_time_ms"].append(t)
            steps["step"].append(self.step)
            steps["loss"].append(None if bad else math.exp(self.rng.normal(0.0,
                                                                           self.shape.noise)))
            steps["grad_norm"].append(None if bad else norm)
            steps["loss_nonfinite"].append(bad)
            steps["grad_nonfinite"].append(bad)
            steps["grad_norm_source"].append("probe")
            latency = self.shape.sync_latency_ms_median * math.exp(
                self.rng.normal(0.0, self.shape.noise)) * (1.5 if self.card.throttled(t)
                                                           else 1.0)
            syncs = out.setdefault("grad_sync", _columns("event_time_ms", "step", "bytes",
                                                         "latency_ms", "ok"))
            syncs["event_time_ms"].append(t)
            syncs["step"].append(self.step)
            syncs["bytes"].append(self.shape.sync_bytes)
            syncs["latency_ms"].append(latency)
            syncs["ok"].append(True)
            self.step += 1
            gap_ms = 1000.0 / rate * math.exp(self.rng.normal(0.0, 0.1))
            self.next_step_ms = t + max(1, int(gap_ms))

    def _episodes(self, a_ms: int, b_ms: int, out: dict) -> None:
        if self.episode_end_ms is None:
            self.episode_end_ms = a_ms + int(self.episode_rng.uniform(0.0, 1.0)
                                             * self._episode_length_s() * 1000)
        faults, shape = self.faults, self.shape
        while self.episode_end_ms < b_ms:
            t = self.episode_end_ms
            stuck = faults.stuck_from_ms is not None and t >= faults.stuck_from_ms
            jumped = faults.jump_from_ms is not None and t >= faults.jump_from_ms
            if stuck:
                reason = faults.stuck_reason
                self.stuck_episodes_seen += 1
                if self.stuck_episodes_seen == 3:
                    self.trace.signal("stuck_episode", self.worker_id, t)
            else:
                names = list(shape.endings)
                weights = np.asarray([shape.endings[n] for n in names], dtype=float)
                reason = names[int(self.episode_rng.choice(len(names),
                                                           p=weights / weights.sum()))]
            std = shape.reward_std * (faults.jump_std_factor if jumped else 1.0)
            reward = float(self.episode_rng.normal(
                shape.reward_mean + self.reward_drift_per_s * (t - self.trace.origin_ms) / 1000,
                std))
            if jumped:
                self.trace.signal("variance_jump", self.worker_id, t)
            length_s = self._episode_length_s() * (0.25 if stuck else 1.0)
            episodes = out.setdefault("episode", _columns(
                "event_time_ms", "episode_index", "reward", "length", "terminated",
                "truncated", "termination_reason"))
            episodes["event_time_ms"].append(t)
            episodes["episode_index"].append(self.episode)
            episodes["reward"].append(reward)
            episodes["length"].append(max(1, int(length_s * shape.steps_per_s)))
            episodes["terminated"].append(reason not in ("time_limit", "truncated", "timeout",
                                                         "max_length"))
            episodes["truncated"].append(reason in ("time_limit", "truncated", "timeout",
                                                    "max_length"))
            episodes["termination_reason"].append(reason)
            self.episode += 1
            self.episode_end_ms = t + max(200, int(length_s * 1000))

    def _every_second(self, a_ms: int, b_ms: int, out: dict) -> None:
        for t in range(-(-a_ms // 1000) * 1000, b_ms, 1000):
            own = self.own_memory_bytes(t)
            # What the probe reports as the process's: NVML's figure counts its context.
            reported = own + (CONTEXT_BYTES if self.samples_nvml else 0)
            if reported > CEILING_BYTES and self.faults.leak_from_ms is not None:
                self.trace.signal("memory_leak", self.worker_id, t)
            cuda = out.setdefault("cuda_memory", _columns(
                "event_time_ms", "device_index", "allocated_bytes", "reserved_bytes",
                "fragmentation_ratio"))
            cuda["event_time_ms"].append(t)
            cuda["device_index"].append(0)
            cuda["allocated_bytes"].append(int(own * 0.92))
            cuda["reserved_bytes"].append(own)
            cuda["fragmentation_ratio"].append(0.08)
            if not self.samples_nvml:
                continue
            throttled = self.card.throttled(t)
            if throttled:
                self.trace.signal("card_degraded", self.card.uuid, t)
            card_bytes = sum(self.trace.worker(w).own_memory_bytes(t) + CONTEXT_BYTES
                             for w in self.card.workers)
            gpu = out.setdefault("gpu", _columns(
                "event_time_ms", "gpu_uuid", "gpu_model", "memory_used_bytes",
                "memory_total_bytes", "utilisation_pct", "temperature_c", "throttle_reasons",
                "process_memory_used_bytes"))
            gpu["event_time_ms"].append(t)
            gpu["gpu_uuid"].append(self.card.uuid)
            gpu["gpu_model"].append("NVIDIA H100 80GB HBM3")
            gpu["memory_used_bytes"].append(card_bytes)
            gpu["memory_total_bytes"].append(80 * GIB)
            gpu["utilisation_pct"].append(float(min(100.0, self.gpu_rng.normal(88.0, 4.0))))
            gpu["temperature_c"].append(float(self.gpu_rng.normal(88.0 if throttled else 68.0,
                                                                  1.5)))
            gpu["throttle_reasons"].append(THERMAL if throttled else 0)
            gpu["process_memory_used_bytes"].append(own + CONTEXT_BYTES)

    def _heartbeats(self, a_ms: int, b_ms: int, out: dict, force: bool) -> None:
        period = int(HEARTBEAT_INTERVAL_S * 1000)
        first = a_ms + (self.heartbeat_offset_ms - a_ms) % period
        times = list(range(first, b_ms, period))
        if force and not times:
            times = [b_ms - 1]
        for t in times:
            beats = out.setdefault("heartbeat", _columns("event_time_ms", "interval_s", "step"))
            beats["event_time_ms"].append(t)
            beats["interval_s"].append(HEARTBEAT_INTERVAL_S)
            beats["step"].append(self.step)

    def document(self, a_ms: int, b_ms: int, heartbeat: bool = False) -> dict:
        """The worker's samples in [a_ms, b_ms) as one probe message dated ``b_ms``;
        ``heartbeat``: one whether due or not (the first message after a gap)."""
        columns: dict = {}
        self._steps(a_ms, b_ms, columns)
        self._episodes(a_ms, b_ms, columns)
        self._every_second(a_ms, b_ms, columns)
        self._heartbeats(a_ms, b_ms, columns, heartbeat)
        self.messages += 1
        return {"schema_version": SCHEMA_VERSION,
                "event_id": f"{self.worker_id}-{self.messages:08d}",
                "event_time_ms": b_ms, "identity": self.identity,
                "gpu_uuid": self.card.uuid, "columns": columns}


def _columns(*names: str) -> dict[str, list]:
    return {name: [] for name in names}


def _seed(spec: TraceSpec, *parts: object) -> int:
    text = "|".join(map(str, (spec.shape, spec.seed, *parts)))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class DetectionTrace:
    """The workers of one (shape, seed): ``documents`` interval by interval, healthy until
    ``start`` schedules the faults from its origin on (a healthy history before it, the
    faults within ``spec.duration_s`` after it). ``origin_ms``: where the returns' slow
    drift starts from."""

    def __init__(self, spec: TraceSpec, origin_ms: int) -> None:
        self.spec = spec
        self.shape: WorkloadShape = SHAPES[spec.shape]
        self.origin_ms = origin_ms
        shape = self.shape
        self.cards: list[_Card] = []
        self.workers: list[_Worker] = []
        per_node = shape.workers_per_card * shape.cards_per_node
        for index in range(spec.workers):
            node, card_index = index // per_node, index // shape.workers_per_card
            if card_index == len(self.cards):
                uuid = f"GPU-{spec.shape}-{spec.seed}-{node:02d}-{card_index:02d}"
                self.cards.append(_Card(uuid, f"{spec.shape}-{spec.seed}-n{node:02d}", []))
            card = self.cards[card_index]
            first_on_card = not card.workers
            card.workers.append(f"{spec.shape}-{spec.seed}-w{index:02d}")
            self.workers.append(_Worker(self, index, card,
                                        shape.nvml_on_every_worker or first_on_card))
        self._by_id = {w.worker_id: w for w in self.workers}
        self.labels: list[FaultLabel] = []
        self._signal_of: dict[tuple[str, str], FaultLabel] = {}
        self.start_ms: int | None = None

    def worker(self, worker_id: str) -> _Worker:
        return self._by_id[worker_id]

    @property
    def end_ms(self) -> int:
        assert self.start_ms is not None, "not started"
        return self.start_ms + int(self.spec.duration_s * 1000)

    def start(self, start_ms: int) -> list[FaultLabel]:
        """Schedules the faults (the same for a seed whenever it is called) from
        ``start_ms`` on; returns their labels, whose ``signal_ms`` fill in as the
        documents are made."""
        self.start_ms = start_ms
        rng = np.random.default_rng(_seed(self.spec, "faults"))
        end_ms = self.end_ms
        low_s, high_s = self.spec.onset_window_s
        free = [w.worker_id for w in self.workers]
        # The card first: its workers are all its targets, and no other fault's.
        for fault_class in sorted(self.spec.faults, key=lambda c: c != "card_degraded"):
            onset_ms = start_ms + int(rng.uniform(low_s, high_s) * 1000)
            if fault_class == "card_degraded":
                card = self.cards[int(rng.integers(len(self.cards)))]
                until_ms = onset_ms + int(rng.uniform(45.0, 90.0) * 1000)
                card.throttled_from_ms, card.throttled_until_ms = onset_ms, until_ms
                free = [w for w in free if w not in card.workers]
                label = FaultLabel(fault_class, tuple(card.workers), onset_ms,
                                   min(until_ms, end_ms) + GRACE_MS, detail={"card": card.uuid})
                self._signal_of[(fault_class, card.uuid)] = label
                self.labels.append(label)
                continue
            target = free.pop(int(rng.integers(len(free))))
            faults = self.worker(target).faults
            label = FaultLabel(fault_class, (target,), onset_ms, end_ms + GRACE_MS)
            if fault_class == "memory_leak":
                faults.leak_from_ms = onset_ms
                faults.leak_bytes_per_s = float(rng.uniform(200e6, 500e6))
                label.detail["leak_bytes_per_s"] = round(faults.leak_bytes_per_s)
            elif fault_class == "stuck_episode":
                faults.stuck_from_ms = onset_ms
                faults.stuck_reason = (f"collision_at_{int(rng.integers(0, 20))}_"
                                       f"{int(rng.integers(0, 20))}")
                label.detail["reason"] = faults.stuck_reason
            elif fault_class == "nan_burst":
                faults.nan_at_ms, faults.nan_steps = onset_ms, int(rng.integers(1, 5))
                label.end_ms = onset_ms + 60_000
                label.detail["steps"] = faults.nan_steps
            elif fault_class == "variance_jump":
                faults.jump_from_ms = onset_ms
                faults.jump_std_factor = float(rng.uniform(5.0, 8.0))
                label.detail["std_factor"] = round(faults.jump_std_factor, 2)
            else:
                raise ValueError(f"no fault class {fault_class!r}")
            self._signal_of[(fault_class, target)] = label
            self.labels.append(label)
        return self.labels

    def signal(self, fault_class: str, key: str, t_ms: int) -> None:
        """The first time the signal of ``fault_class`` exists, for the worker (or card)
        ``key``."""
        label = self._signal_of.get((fault_class, key))
        if label is not None and label.signal_ms is None:
            label.signal_ms = t_ms

    def documents(self, a_ms: int, b_ms: int, interval_ms: int,
                  heartbeat_first: bool = False) -> Iterator[dict]:
        """Every worker's messages for [a_ms, b_ms), one per ``interval_ms`` each, in
        time order."""
        first = True
        for start in range(a_ms, b_ms, interval_ms):
            end = min(start + interval_ms, b_ms)
            for worker in self.workers:
                yield worker.document(start, end, heartbeat=heartbeat_first and first)
            first = False
