"""``--scenario random --seed N``: a scenario drawn from stated distributions, so that a
result does not rest on one hand-written schedule.

The draw, for seed N (numpy's default generator seeded with N):
- fault kinds: 3 to 6 kinds (uniform), drawn without replacement from every kind but
  ``crash``; a hard crash is always possible, at 0.01 per simulated hour per worker;
- per kind: rate per simulated hour log-uniform in [0.1, 0.6]; 1 to 3 target workers
  (uniform), drawn without replacement from workers 0-7;
- durations, in simulated hours, uniform in [0.5, 4] (leaks, heat, jitter, stuck
  episodes, stragglers, flaky cards); a stall uniform in [1, 5] s;
- kind parameters: a leak of 2 or 4 MiB a step on episodes of at least 1 or 150 steps,
  live share 0, 0.5 or 1 (uniform); a NaN burst with a precursor of 0 or 8 s (uniform);
  a straggler 2 to 4 times slower (uniform); a flaky card failing 8 to 20 s after each
  start (uniform).
Onsets are then drawn by ``fault_schedule`` as for any scenario: a Poisson process per
(kind, target), seeded with N.
"""

from __future__ import annotations

import numpy as np

from dsec.experiment.faults import FAULT_KINDS, Scenario

RANDOM = "random"
MIB = 1 << 20
DRAWN_KINDS = tuple(k for k in FAULT_KINDS if k != "crash")
TARGET_POOL = 8
CRASH_RATE_PER_HOUR = 0.01


def _params(kind: str, rng: np.random.Generator) -> dict:
    duration_h = round(float(rng.uniform(0.5, 4.0)), 2)
    if kind == "memory_leak":
        return {"duration_h": duration_h, "long_episode_steps": int(rng.choice([1, 150])),
                "bytes_per_step": int(rng.choice([2, 4])) * MIB,
                "live_share": float(rng.choice([0.0, 0.5, 1.0]))}
    if kind == "sync_stall":
        return {"stall_s": round(float(rng.uniform(1.0, 5.0)), 2)}
    if kind == "nan_burst":
        return {"precursor_s": float(rng.choice([0.0, 8.0]))}
    if kind == "straggler":
        return {"duration_h": duration_h, "slowdown": round(float(rng.uniform(2.0, 4.0)), 2)}
    if kind == "flaky_card":
        return {"duration_h": duration_h,
                "fail_after_s": round(float(rng.uniform(8.0, 20.0)), 1)}
    if kind == "silent_hang":
        return {}
    return {"duration_h": duration_h}


def random_scenario(seed: int) -> Scenario:
    rng = np.random.default_rng(seed)
    count = int(rng.integers(3, 7))
    kinds = sorted(rng.choice(len(DRAWN_KINDS), size=count, replace=False))
    faults: dict[str, dict] = {"crash": {"rate_per_hour": CRASH_RATE_PER_HOUR}}
    for index in kinds:
        kind = DRAWN_KINDS[int(index)]
        targets = sorted(int(t) for t in rng.choice(TARGET_POOL, size=int(rng.integers(1, 4)),
                                                    replace=False))
        rate = float(np.exp(rng.uniform(np.log(0.1), np.log(0.6))))
        faults[kind] = {"rate_per_hour": round(rate, 3), "targets": targets,
                        **_params(kind, rng)}
    return Scenario.model_validate({
        "name": f"{RANDOM}-{seed}", "seed": seed,
        "description": f"Drawn from the stated distributions with seed {seed}: "
                       + ", ".join(sorted(k for k in faults if k != "crash")) + ".",
        "faults": faults})
