"""``dsec bench policy-eval``: the built-in pack's conditions over N synthetic targets,
compiled to numpy against cel-python on the same inputs."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Annotated, Literal

import typer

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np

    from dsec.policy_engine.engine import Engine
    from dsec.schemas import PolicySpec


def synthetic_columns(targets: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Every catalogue feature for every target, spread so that conditions go both ways;
    about 5 % of targets lack any one feature."""
    import numpy as np

    from dsec.schemas.features import FLEET_FEATURES, WORKER_FEATURES

    rng = np.random.default_rng(seed)
    columns = {}
    for name in (*WORKER_FEATURES, *FLEET_FEATURES):
        scale = 16 * (1 << 30) if "bytes" in name else 150.0
        values = rng.uniform(0.0, scale, targets)
        if name in ("worker_lost", "pool_utilisation_rate"):
            values = rng.uniform(0.0, 1.0, targets)
        values[rng.random(targets) < 0.05] = np.nan
        columns[name] = values
    return columns


HEALTHY = {
    "reward_episodes": 20.0, "reward_variance_jump_ratio": 1.0,
    "episode_same_end_streak": 1.0, "grad_norm_spike_z": 0.5, "grad_norm_jumps": 0.0,
    "grad_nonfinite_count": 0.0,
    "loss_nonfinite_count": 0.0, "grad_sync_latency_p50_ms": 20.0,
    "grad_sync_latency_p95_ms": 30.0, "grad_sync_latency_p99_ms": 40.0,
    "grad_sync_bytes_per_s": 50e6, "gpu_memory_used_bytes": 5.0 * (1 << 30),
    "gpu_thermal_throttle_events": 0.0, "heartbeat_age_s": 1.0, "worker_lost": 0.0,
}


# Where an engine step's batch comes from: columns, decoded events, or the features
# topic's message values, decoded inside the step as the policy engine's agent does:
# one event a message (``wire``), or ``FeatureColumns`` messages of ``COLUMN_ROWS`` rows
# (``columns``), as the metrics job sends a batch of probe messages.
StepSource = Literal["packed", "events", "wire", "columns", "backlog"]
COLUMN_ROWS = 500
BACKLOG_ROUNDS = 10


def engine_step_ms(targets: int, tripping: float = 0.01, source: StepSource = "packed") -> float:
    """The median of ``engine_step_times_ms``."""
    import statistics

    return statistics.median(engine_step_times_ms(targets, tripping, source))


def builtin_engine(adjust: Callable[[PolicySpec], PolicySpec] | None = None) -> Engine:
    """An engine over the built-in pack (each policy through ``adjust`` first), signing
    with a fresh keyring."""
    from dsec.policy_engine.builtin import load_builtin_policies
    from dsec.policy_engine.engine import Engine
    from dsec.policy_engine.registry import PolicyRegistry
    from dsec.schemas.signing import TrustListVerifier, new_keyring

    keyring, trust, _ = new_keyring(expires_at_ms=int(time.time() * 1000) + 86_400_000)
    registry = PolicyRegistry(TrustListVerifier(trust))
    for policy in load_builtin_policies():
        registry.install_trusted(adjust(policy) if adjust is not None else policy)
    return Engine(registry, {}, {}, keyring)


def engine_step_times_ms(targets: int, tripping: float = 0.01, source: StepSource = "packed",
                         steps: int = 6) -> list[float]:
    """Whole engine steps (feature events to columns, conditions, state machine, signed
    commands, audit records) over one event per target every 5 s of event time, in
    steady state: after two warm-up steps, ``steps`` steps timed one by one (30 s: the
    breaker's commands for the ``tripping`` share of targets over its latency cap, and
    the known features written for each target once).
    ``source``: ``packed``, the batch comes as columns (``FeatureBatch.packed``, as a
    stream job's packed output would give it); ``events``, as decoded ``FeatureEvent``
    objects, taken to columns inside the step; ``wire``, as single encoded events on the
    features topic, each decoded and validated inside the step; ``columns``, as the
    ``FeatureColumns`` messages the metrics job sends, each decoded and validated inside
    the step; ``backlog``, as packed columns where each target has ``BACKLOG_ROUNDS``
    events, 0.5 s apart (an engine catching up)."""
    import numpy as np

    from dsec.policy_engine.feature_batch import FeatureBatch
    from dsec.schemas import FeatureEvent, WorkerIdentity, decode, encode
    from dsec.schemas.feature_columns import decode_features, pack_feature_events

    every = max(1, round(1 / tripping))
    job_ids = ["bench"] * targets
    worker_ids = [f"w{i}" for i in range(targets)]
    node_ids = [f"n{i // 8}" for i in range(targets)]
    columns = {name: np.full(targets, value) for name, value in HEALTHY.items()}
    columns["grad_sync_latency_p95_ms"][::every] = 120.0

    def step(time_ms: int) -> FeatureBatch | list[FeatureEvent] | list[bytes]:
        if source == "packed":
            return FeatureBatch.packed(job_ids, worker_ids, node_ids,
                                       np.full(targets, time_ms, dtype=np.int64), columns)
        if source == "backlog":
            return FeatureBatch.concat([
                FeatureBatch.packed(job_ids, worker_ids, node_ids,
                                    np.full(targets, time_ms - 500 * (BACKLOG_ROUNDS - 1 - k),
                                            dtype=np.int64), columns)
                for k in range(BACKLOG_ROUNDS)])
        events = [
            FeatureEvent(
                identity=WorkerIdentity(job_id="bench", worker_id=f"w{i}", node_id=f"n{i // 8}"),
                event_time_ms=time_ms,
                features={**HEALTHY, "grad_sync_latency_p95_ms": 120.0} if i % every == 0
                else HEALTHY,
            )
            for i in range(targets)
        ]
        if source == "columns":
            return [encode(pack_feature_events(events[start:start + COLUMN_ROWS],
                                               f"columns-{time_ms}-{start}", time_ms))
                    for start in range(0, targets, COLUMN_ROWS)]
        return [encode(event) for event in events] if source == "wire" else events

    engine = builtin_engine()

    def evaluate(batch: FeatureBatch | list[FeatureEvent] | list[bytes]) -> None:
        if isinstance(batch, FeatureBatch):
            engine.evaluate_batch(batch)
        elif source == "wire":
            engine.evaluate([decode(value, FeatureEvent) for value in batch])
        elif source == "columns":
            engine.evaluate_batch(FeatureBatch.concat(
                [FeatureBatch.from_rows(decode_features(value)) for value in batch]))
        else:
            engine.evaluate(batch)

    evaluate(step(1_000_000))
    evaluate(step(1_005_000))
    times_ms = []
    for index in range(steps):
        batch = step(1_010_000 + index * 5_000)
        start = time.perf_counter()
        evaluate(batch)
        times_ms.append((time.perf_counter() - start) * 1000)
    return times_ms


def run(targets: int, repeats: int, celpy_sample: int) -> dict:
    import numpy as np

    from dsec.bench.snapshot_rounds import snapshot_rounds
    from dsec.policy_engine.builtin import load_builtin_policies
    from dsec.policy_engine.registry import compile_policy

    compiled = [compile_policy(p) for p in load_builtin_policies()]
    features = synthetic_columns(targets)
    scoped = [
        (c, {**features, **{k: np.full(targets, v) for k, v in c.spec.params.items()}})
        for c in compiled
    ]
    conditions = [(cond, columns) for c, columns in scoped
                  for cond in (c.enter, c.exit) if cond is not None]

    def vectorised() -> list[np.ndarray]:
        return [cond.holds(columns, targets) for cond, columns in conditions]

    vectorised()  # warm up
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        results = vectorised()
        timings.append(time.perf_counter() - start)
    vectorised_ms = float(np.median(timings) * 1000)

    sample = min(celpy_sample, targets)
    sampled = [(cond, {k: v[:sample] for k, v in columns.items()})
               for cond, columns in conditions]
    start = time.perf_counter()
    reference = [cond.holds_scalar(columns, sample) for cond, columns in sampled]
    celpy_sample_ms = (time.perf_counter() - start) * 1000
    celpy_ms = celpy_sample_ms * targets / sample
    agree = all(np.array_equal(r[:sample], ref) for r, ref in zip(results, reference,
                                                                   strict=True))
    return {
        "targets": targets,
        "policies": len(compiled),
        "conditions": len(conditions),
        "vectorised_ms": round(vectorised_ms, 3),
        "celpy_ms": round(celpy_ms, 1),
        "speedup": round(celpy_ms / vectorised_ms, 1),
        "celpy_extrapolated_from_targets": sample if sample < targets else None,
        "agree_on_sample": agree,
        "fires_per_condition": [int(r.sum()) for r in results],
        "repeats": repeats,
        "engine_step_ms": round(engine_step_ms(targets), 1),
        "engine_step_from_events_ms": round(engine_step_ms(targets, source="events"), 1),
        "engine_step_from_wire_ms": round(engine_step_ms(targets, source="wire"), 1),
        "engine_step_from_columns_ms": round(engine_step_ms(targets, source="columns"), 1),
        "engine_backlog_step_ms": round(backlog_ms := engine_step_ms(targets, source="backlog"),
                                        1),
        "engine_backlog_step_per_round_ms": round(backlog_ms / BACKLOG_ROUNDS, 1),
        "snapshot_rounds": snapshot_rounds(targets),
        "engine_step_note": "whole engine step, median of 6 steady-state steps, 1% of "
                            "targets tripping: from a packed batch, from decoded "
                            "feature events, from their encoded bytes one event a "
                            f"message, and from FeatureColumns messages of {COLUMN_ROWS} "
                            "rows as the metrics job sends them; a backlog step holds "
                            f"{BACKLOG_ROUNDS} events per target, 0.5 s apart",
    }


def policy_eval(
    targets: Annotated[int, typer.Option(min=1, max=1_000_000)] = 10_000,
    repeats: Annotated[int, typer.Option(min=1, max=1000)] = 20,
    celpy_sample: Annotated[int, typer.Option(
        min=1, help="Targets cel-python evaluates; its time is scaled to all targets.")] = 500,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """The built-in pack over N targets: compiled (numpy) against cel-python."""
    result = run(targets, repeats, celpy_sample)
    if as_json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        typer.echo(f"{key}: {value}")
