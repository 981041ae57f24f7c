"""Rounds of the periodic snapshot over a fleet seen at once, with and without the
built-in's ``jitter_s``, side by side: how many commands one engine step has to sign and
how long the slowest step takes, once the first round (every worker at first sight) is
past.

Each arm runs the whole built-in pack in an engine of its own over ``targets`` healthy
workers, a feature event per worker every 5 s for ``minutes`` of event time. The
``jittered`` arm runs ``periodic-snapshot`` as shipped; the ``unjittered`` arm the same
policy with ``jitter_s`` 0 and its cooldown at the jittered gap's longest (the period it
promises), so that neither arm snapshots a worker less often than the other promises.
"""

from __future__ import annotations

import statistics
import time

STEP_MS = 5_000
SNAPSHOT = "periodic-snapshot"


def _arm(targets: int, minutes: int, jitter: bool, window_min: int) -> dict:
    import numpy as np

    from dsec.bench.policy_eval import HEALTHY, builtin_engine
    from dsec.policy_engine.feature_batch import FeatureBatch
    from dsec.schemas import PolicySpec

    def unjittered(policy: PolicySpec) -> PolicySpec:
        if policy.name != SNAPSHOT:
            return policy
        return policy.model_copy(update={
            "cooldown_s": policy.cooldown_s + policy.jitter_s, "jitter_s": 0.0})

    engine = builtin_engine(None if jitter else unjittered)
    workers = [f"w{i}" for i in range(targets)]
    nodes = [f"n{i // 8}" for i in range(targets)]
    columns = {name: np.full(targets, value) for name, value in HEALTHY.items()}
    steps: list[tuple[float, int]] = []
    for t_ms in range(0, minutes * 60_000, STEP_MS):
        batch = FeatureBatch.packed(["bench"] * targets, workers, nodes,
                                    np.full(targets, 1_000_000 + t_ms, dtype=np.int64), columns)
        start = time.perf_counter()
        out = engine.evaluate_batch(batch)
        snapshots = sum(1 for command in out.commands if command.policy_name == SNAPSHOT)
        steps.append(((time.perf_counter() - start) * 1000, snapshots))
    last = steps[-(window_min * 60_000 // STEP_MS):]
    return {
        "first_round_snapshots": steps[0][1],
        "snapshots": sum(count for _, count in steps),
        "last_window_max_snapshots_per_step": max(count for _, count in last),
        "last_window_mean_snapshots_per_step": round(
            statistics.fmean(count for _, count in last), 1),
        "last_window_max_step_ms": round(max(ms for ms, _ in last), 1),
        "last_window_median_step_ms": round(statistics.median(ms for ms, _ in last), 1),
    }


def snapshot_rounds(targets: int, minutes: int = 15, window_min: int = 5) -> dict:
    """Both arms, and the jittered arm's figures over the unjittered one's."""
    jittered = _arm(targets, minutes, True, window_min)
    unjittered = _arm(targets, minutes, False, window_min)

    def ratio(key: str) -> float | None:
        return round(jittered[key] / unjittered[key], 3) if unjittered[key] else None

    return {
        "targets": targets, "minutes": minutes, "window_min": window_min,
        "jittered": jittered, "unjittered": unjittered,
        "max_snapshots_per_step_ratio": ratio("last_window_max_snapshots_per_step"),
        "max_step_ratio": ratio("last_window_max_step_ms"),
        "snapshots_ratio": ratio("snapshots"),
    }
