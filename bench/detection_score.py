"""The detection bench's figures from labels and stored decisions: pure functions, no I/O.

A firing is a ``fired`` decision (a one-shot policy's command, or a staged policy's first
stage; its records for each action of the stage count once). One that names a target of
a fault of the policy's class between the fault's onset and its label's end detects it;
any other firing of any policy is a false one, except the routine ``periodic-snapshot``.
Per class and overall: precision (firings that detect over all firings), recall (targets
detected over targets whose signal existed in the run), F1, and the detection latency
from the signal (and from the onset), p50 and p95. A command is corrective on a healthy
worker when it names a worker that no fault covers at that time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from dsec.bench.detection_traces import FaultLabel
from dsec.bench.detection_workloads import CLASS_POLICY

__all__ = ["ROUTINE_POLICIES", "Firing", "score"]

# Policies that act on every healthy worker by design: not detections, not false ones.
ROUTINE_POLICIES = frozenset({"periodic-snapshot"})
_CLASS_OF = {policy: fault_class for fault_class, policy in CLASS_POLICY.items()}


@dataclass(frozen=True)
class Firing:
    """A fired decision, or (``command``) a command sent: when, by which policy, for whom."""

    time_ms: int
    policy: str
    job_id: str
    worker_id: str
    detail: str = field(default="", compare=False)  # what the decision saw


def _percentiles_s(values_ms: Sequence[float]) -> dict[str, float | None]:
    if not values_ms:
        return {"p50": None, "p95": None, "max": None}
    array = np.asarray(values_ms, dtype=float) / 1000.0
    return {"p50": round(float(np.percentile(array, 50)), 2),
            "p95": round(float(np.percentile(array, 95)), 2),
            "max": round(float(array.max()), 2)}


def _f1(precision: float | None, recall: float | None) -> float | None:
    if precision is None or recall is None:
        return None
    return 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)


def _ratio(part: int, whole: int) -> float | None:
    return None if whole == 0 else part / whole


def _covers(label: FaultLabel, worker_id: str, time_ms: int) -> bool:
    return worker_id in label.targets and label.onset_ms <= time_ms <= label.end_ms


def score(labels: Mapping[str, Sequence[FaultLabel]], firings: Iterable[Firing],
          commands: Iterable[Firing]) -> dict:
    """``labels``: by job id. ``firings`` and ``commands``: those of the scored window."""
    per_class = {c: {"targets": 0, "no_signal": 0, "detected": 0, "firings": 0,
                     "true_firings": 0, "latency_ms": [], "latency_from_onset_ms": []}
                 for c in CLASS_POLICY}
    other = Counter()
    false_firings: list[Firing] = []
    first_detection: dict[tuple[str, int, str], int] = {}
    # A staged policy audits each action of its stage: one firing, however many records.
    for firing in sorted(set(firings), key=lambda f: (f.time_ms, f.policy, f.worker_id)):
        if firing.policy in ROUTINE_POLICIES:
            continue
        fault_class = _CLASS_OF.get(firing.policy)
        if fault_class is None:
            other[firing.policy] += 1
            false_firings.append(firing)
            continue
        figures = per_class[fault_class]
        figures["firings"] += 1
        for index, label in enumerate(labels.get(firing.job_id, ())):
            if label.fault_class == fault_class and _covers(label, firing.worker_id,
                                                            firing.time_ms):
                figures["true_firings"] += 1
                first_detection.setdefault((firing.job_id, index, firing.worker_id),
                                           firing.time_ms)
                break
        else:
            false_firings.append(firing)
    missed = []
    for job_id, job_labels in labels.items():
        for index, label in enumerate(job_labels):
            figures = per_class[label.fault_class]
            for target in label.targets:
                if label.signal_ms is None:
                    figures["no_signal"] += 1
                    continue
                figures["targets"] += 1
                found_ms = first_detection.get((job_id, index, target))
                if found_ms is None:
                    missed.append({"job_id": job_id, "class": label.fault_class,
                                   "target": target, **label.to_json()})
                    continue
                figures["detected"] += 1
                figures["latency_ms"].append(found_ms - label.signal_ms)
                figures["latency_from_onset_ms"].append(found_ms - label.onset_ms)
    classes, totals = {}, Counter()
    latencies: list[float] = []
    for fault_class, figures in per_class.items():
        precision = _ratio(figures["true_firings"], figures["firings"])
        recall = _ratio(figures["detected"], figures["targets"])
        classes[fault_class] = {
            "policy": CLASS_POLICY[fault_class],
            "targets": figures["targets"], "no_signal": figures["no_signal"],
            "detected": figures["detected"], "firings": figures["firings"],
            "false_firings": figures["firings"] - figures["true_firings"],
            "precision": _round(precision), "recall": _round(recall),
            "f1": _round(_f1(precision, recall)),
            "latency_s": _percentiles_s(figures["latency_ms"]),
            "latency_from_onset_s": _percentiles_s(figures["latency_from_onset_ms"]),
        }
        for key in ("targets", "detected", "firings", "true_firings"):
            totals[key] += figures[key]
        latencies += figures["latency_ms"]
    all_firings = totals["firings"] + sum(other.values())
    precision = _ratio(totals["true_firings"], all_firings)
    recall = _ratio(totals["detected"], totals["targets"])
    every_label = [label for job_labels in labels.values() for label in job_labels]
    healthy = Counter()
    for command in commands:
        if command.policy in ROUTINE_POLICIES:
            continue
        job_labels = labels.get(command.job_id, ())
        if not any(_covers(label, command.worker_id, command.time_ms) for label in job_labels):
            healthy[command.policy] += 1
    return {
        "overall": {
            "targets": totals["targets"], "detected": totals["detected"],
            "firings": all_firings, "false_firings": all_firings - totals["true_firings"],
            "precision": _round(precision), "recall": _round(recall),
            "f1": _round(_f1(precision, recall)), "latency_s": _percentiles_s(latencies),
        },
        "classes": classes,
        "other_policies_fired": dict(other),
        "corrective_commands_on_healthy_workers": sum(healthy.values()),
        "corrective_commands_on_healthy_workers_by_policy": dict(healthy),
        "faults": len(every_label),
        "missed": missed,
        "false_firings": [{"time_ms": f.time_ms, "policy": f.policy, "job_id": f.job_id,
                           "worker_id": f.worker_id, "detail": f.detail}
                          for f in false_firings],
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
