"""Goodput measures from the workers' timelines: pure functions, no broker, no clock.

Definitions (wall seconds of the run):
- interruption: a worker process died (OOM, NaN in the weights, crash);
- recovery time: from the death until the worker trains again (its replacement resumed
  in the group, state restored); a worker still down at the run's end counts the time
  to the end (a lower bound) and is counted as unrecovered;
- lost work: step time of updates a group had to redo because it resumed from a resume
  point older than its progress (counted against effective time, shown apart);
- effective training time ratio: step time of updates that were kept, over workers x
  wall time: an update undone by a rollback (the group resumed from before it) is not
  productive, nor is a step taken with the sampler paused, nor the share of an update's
  optimizer steps that were skipped (non-finite gradients, by loss scaling or dsec's
  step guard);
- GPU utilisation: simulated device busy time over workers x wall time;
- steps per second: every optimizer step taken (kept or later lost) over wall time;
- return: the final mean return, and the area under the return curve (each twelfth's
  mean episode return times its length, 0 where no episode ended: return x seconds);
- degraded time: step time run in a degraded mode (fp16/bf16, compressed gradients,
  accumulation, sampler paused), by mode, and its share of workers x wall time.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

OPTIMIZER_STEPS_PER_UPDATE = 8  # PpoConfig: 2 epochs x 4 minibatches
Event = Mapping[str, object]


def read_timelines(arm_dir: Path) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for path in sorted(arm_dir.glob("timeline-*.jsonl")):
        slot = int(path.stem.split("-")[1])
        events = []
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by a kill
                continue
        out[slot] = sorted(events, key=lambda e: e["t"])
    return out


def degraded_modes(event: Event) -> list[str]:
    """The degraded modes an update ran in, as the worker recorded them."""
    modes = ["sampler_paused"] if event["e"] == "paused_update" else []
    dtype = str(event.get("dtype", "fp32"))
    if dtype != "fp32":
        modes.append(dtype)
    bits = int(event.get("bits", 32))  # type: ignore[call-overload]
    if bits < 32:
        modes.append(f"{bits}-bit")
    if int(event.get("window", 1)) > 1:  # type: ignore[call-overload]
        modes.append("accumulation")
    return modes


@dataclass
class WorkerMeasure:
    productive_s: float = 0.0
    lost_work_s: float = 0.0
    busy_s: float = 0.0
    updates_kept: int = 0
    interruptions: int = 0
    causes: dict[str, int] = field(default_factory=dict)
    recoveries_s: list[float] = field(default_factory=list)
    unrecovered: int = 0  # deaths not recovered from by the run's end
    updates_done: int = 0  # kept or not
    degraded_s: dict[str, float] = field(default_factory=dict)
    degraded_any_s: float = 0.0
    steps_skipped: int = 0  # optimizer steps kept off the weights (non-finite gradients)


def kept_share(event: Event) -> float:
    """The share of an update's optimizer steps that changed the weights."""
    steps = int(event.get("opt_steps", 0))  # type: ignore[call-overload]
    skipped = int(event.get("skipped", 0))  # type: ignore[call-overload]
    return 1.0 - skipped / steps if steps else 1.0


def measure_worker(events: Sequence[Event], t0_s: float, end_at_s: float) -> WorkerMeasure:
    """One worker slot, across its incarnations."""
    result = WorkerMeasure()
    kept: list[tuple[int, float]] = []  # (updates after the update, its step time)
    died_at: float | None = None
    for event in events:
        kind, t = event["e"], float(event["t"])  # type: ignore[arg-type]
        if kind in ("update", "paused_update"):
            # only the part of the step inside the measured window counts
            dur = float(event["dur"])  # type: ignore[arg-type]
            inside = max(0.0, min(t, end_at_s) - max(t - dur, t0_s))
            if inside > 0:
                result.updates_done += 1
                modes = degraded_modes(event)
                for mode in modes:
                    result.degraded_s[mode] = result.degraded_s.get(mode, 0.0) + inside
                result.degraded_any_s += inside if modes else 0.0
            if inside > 0 and kind == "update":
                kept.append((int(event["updates"]), inside * kept_share(event)))  # type: ignore[arg-type]
                result.steps_skipped += int(event.get("skipped", 0))  # type: ignore[call-overload]
                result.busy_s += float(event.get("busy_s", 0.0)) * inside / dur  # type: ignore[arg-type]
        elif kind == "resume":
            resumed_at = int(event["updates"])  # type: ignore[arg-type]
            lost = [d for u, d in kept if u > resumed_at]
            result.lost_work_s += sum(lost)
            kept = [(u, d) for u, d in kept if u <= resumed_at]
            if died_at is not None:
                result.recoveries_s.append(t - died_at)
                died_at = None
        elif kind == "death" and t <= end_at_s:
            result.interruptions += 1
            cause = str(event.get("cause", "unknown"))
            result.causes[cause] = result.causes.get(cause, 0) + 1
            died_at = t
    if died_at is not None:  # still down at the end: at least this long
        result.recoveries_s.append(end_at_s - died_at)
        result.unrecovered += 1
    result.productive_s = sum(d for _, d in kept)
    result.updates_kept = len(kept)
    return result


def return_curve(timelines: Mapping[int, Sequence[Event]], t0_s: float, end_at_s: float,
                 bins: int = 12) -> list[float | None]:
    """Mean episode return per time bin, over every worker of the arm."""
    edges = np.linspace(t0_s, end_at_s, bins + 1)
    sums, counts = np.zeros(bins), np.zeros(bins)
    for events in timelines.values():
        for event in events:
            if event["e"] != "episode":
                continue
            index = int(np.searchsorted(edges, float(event["t"]), side="right")) - 1  # type: ignore[arg-type]
            if 0 <= index < bins:
                sums[index] += float(event["ret"])  # type: ignore[arg-type]
                counts[index] += 1
    return [round(float(s / c), 2) if c else None for s, c in zip(sums, counts, strict=True)]


def return_auc(curve: Sequence[float | None], t0_s: float, end_at_s: float) -> float:
    """The area under the return curve, in return x seconds (a bin with no episode
    ended counts 0: no learning shown there)."""
    bin_s = (end_at_s - t0_s) / max(1, len(curve))
    return round(sum(v or 0.0 for v in curve) * bin_s, 1)


def final_mean_return(timelines: Mapping[int, Sequence[Event]], t0_s: float, end_at_s: float,
                      tail_fraction: float = 0.2) -> float | None:
    """Mean return at the end of the run: each worker's mean over the episodes that ended
    in the last ``tail_fraction`` of the run, averaged over workers (a worker stuck in
    many short episodes counts once, not once per episode)."""
    start = end_at_s - (end_at_s - t0_s) * tail_fraction
    means = []
    for events in timelines.values():
        returns = [float(e["ret"]) for e in events  # type: ignore[arg-type]
                   if e["e"] == "episode" and start <= float(e["t"]) <= end_at_s]  # type: ignore[arg-type]
        if returns:
            means.append(float(np.mean(returns)))
    return round(float(np.mean(means)), 2) if means else None


def _applied(event: Event) -> bool:
    return event["e"] == "action" and event.get("status", "applied") == "applied"


def actions_applied(timelines: Mapping[int, Sequence[Event]]) -> list[dict]:
    """Every action a worker reported applied (in force, read back), in time order."""
    return sorted(({"t": float(e["t"]), "worker": slot, "kind": e["kind"]}  # type: ignore[arg-type]
                   for slot, events in timelines.items() for e in events
                   if _applied(e)), key=lambda a: a["t"])


def actions_not_applied(timelines: Mapping[int, Sequence[Event]]) -> dict[str, int]:
    """``kind:status`` -> how many: what the workers reported instead (a cap deferred, an
    action the loop did not carry out, a command superseded before it took effect)."""
    return _count(f"{e['kind']}:{e['status']}" for events in timelines.values()
                  for e in events if e["e"] == "action" and not _applied(e))


@dataclass
class ArmResult:
    interruptions: int
    causes: dict[str, int]
    recovery_mean_s: float | None
    recovery_p95_s: float | None
    unrecovered: int
    lost_work_s: float
    effective_training_time_ratio: float
    steps: int
    gpu_utilisation: float
    final_mean_return: float | None
    return_auc: float
    steps_per_s: float
    degraded_ratio: float
    degraded_s: dict[str, float]
    return_curve: list[float | None]
    actions: dict[str, int]
    actions_not_applied: dict[str, int]
    action_timeline: list[dict]
    deaths: list[dict]
    per_worker: dict[int, dict]
    steps_skipped: int = 0

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _count(items: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


def measure_arm(timelines: Mapping[int, Sequence[Event]], t0_s: float,
                end_at_s: float) -> ArmResult:
    wall_s = end_at_s - t0_s
    workers = {slot: measure_worker(events, t0_s, end_at_s) for slot, events in timelines.items()}
    slots = max(1, len(workers))
    recoveries = [r for w in workers.values() for r in w.recoveries_s]
    causes: dict[str, int] = {}
    for w in workers.values():
        for cause, n in w.causes.items():
            causes[cause] = causes.get(cause, 0) + n
    applied = actions_applied(timelines)
    curve = return_curve(timelines, t0_s, end_at_s)
    degraded: dict[str, float] = {}
    for w in workers.values():
        for mode, seconds in w.degraded_s.items():
            degraded[mode] = round(degraded.get(mode, 0.0) + seconds, 2)
    return ArmResult(
        interruptions=sum(w.interruptions for w in workers.values()),
        causes=causes,
        recovery_mean_s=round(float(np.mean(recoveries)), 3) if recoveries else None,
        recovery_p95_s=round(float(np.percentile(recoveries, 95)), 3) if recoveries else None,
        unrecovered=sum(w.unrecovered for w in workers.values()),
        lost_work_s=round(sum(w.lost_work_s for w in workers.values()), 2),
        effective_training_time_ratio=round(
            sum(w.productive_s for w in workers.values()) / (slots * wall_s), 4),
        steps=sum(w.updates_kept for w in workers.values()) * OPTIMIZER_STEPS_PER_UPDATE,
        gpu_utilisation=round(sum(w.busy_s for w in workers.values()) / (slots * wall_s), 4),
        final_mean_return=final_mean_return(timelines, t0_s, end_at_s),
        return_auc=return_auc(curve, t0_s, end_at_s),
        steps_per_s=round(sum(w.updates_done for w in workers.values())
                          * OPTIMIZER_STEPS_PER_UPDATE / wall_s, 3),
        degraded_ratio=round(sum(w.degraded_any_s for w in workers.values())
                             / (slots * wall_s), 4),
        degraded_s=degraded,
        return_curve=curve,
        actions=_count(a["kind"] for a in applied),
        actions_not_applied=actions_not_applied(timelines),
        action_timeline=[{**a, "t": round(a["t"] - t0_s, 2)} for a in applied],
        deaths=[{"worker": slot, "t": round(float(e["t"]) - t0_s, 2),  # type: ignore[arg-type]
                 "cause": e.get("cause", "unknown")}
                for slot, events in timelines.items() for e in events if e["e"] == "death"],
        per_worker={slot: {"interruptions": w.interruptions,
                           "productive_s": round(w.productive_s, 2),
                           "lost_work_s": round(w.lost_work_s, 2),
                           "updates_kept": w.updates_kept}
                    for slot, w in workers.items()},
        steps_skipped=sum(w.steps_skipped for w in workers.values()),
    )
