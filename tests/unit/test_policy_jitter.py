"""A policy's ``jitter_s``: each gap between a target's fires is the cooldown plus a wait
drawn from the target and its last fire, so targets that fired together drift apart."""

from __future__ import annotations

import time
from itertools import pairwise

import numpy as np

from dsec.policy_engine import PolicyState, decide, load_builtin_policies
from dsec.policy_engine.engine import Engine
from dsec.policy_engine.feature_batch import FeatureBatch
from dsec.policy_engine.jitter import cooldown_jitter_ms, target_hash
from dsec.policy_engine.registry import PolicyRegistry
from dsec.schemas import PolicySpec
from dsec.schemas.policies import DecisionKind
from dsec.schemas.signing import TrustListVerifier, new_keyring

HASHES = np.array([target_hash(f"job|w{i}") for i in range(10_000)], dtype=np.uint64)


def test_the_wait_is_drawn_in_range_the_same_every_time_and_anew_for_each_fire() -> None:
    fired_ms = np.full(HASHES.size, 1_000_000, dtype=np.int64)
    waits = cooldown_jitter_ms(HASHES, fired_ms, 15_000)
    assert waits.min() >= 0 and waits.max() < 15_000
    assert np.array_equal(waits, cooldown_jitter_ms(HASHES, fired_ms, 15_000))
    # Spread evenly: each fifth of the range holds about a fifth of the targets.
    counts, _ = np.histogram(waits, bins=5, range=(0, 15_000))
    assert counts.min() > 0.17 * HASHES.size and counts.max() < 0.23 * HASHES.size
    # A target's next fire draws another wait.
    later = cooldown_jitter_ms(HASHES, fired_ms + 80_000, 15_000)
    assert abs(np.corrcoef(waits, later)[0, 1]) < 0.05
    assert not cooldown_jitter_ms(HASHES, fired_ms, 0).any()


def test_decide_waits_the_cooldown_and_the_draw() -> None:
    policy = PolicySpec.model_validate({
        "name": "p", "condition": "x > 1.0", "cooldown_s": 60, "jitter_s": 10,
        "action": {"params": {"kind": "snapshot"}}})
    state = PolicyState(last_fired_ms=0)
    assert decide(policy, state, True, 64_999, cooldown_jitter_ms=5_000)[1] is (
        DecisionKind.SUPPRESSED_COOLDOWN)
    assert decide(policy, state, True, 65_000, cooldown_jitter_ms=5_000)[1] is DecisionKind.FIRED


def test_a_fleet_seen_at_once_is_snapshotted_at_once_and_then_spread_out() -> None:
    keyring, trust, _ = new_keyring(expires_at_ms=int(time.time() * 1000) + 86_400_000)
    registry = PolicyRegistry(TrustListVerifier(trust))
    spec = {p.name: p for p in load_builtin_policies()}["periodic-snapshot"]
    registry.install_trusted(spec)
    engine = Engine(registry, {}, {}, keyring)
    workers = [f"w{i}" for i in range(1000)]
    fired: dict[str, list[int]] = {}
    start_ms, step_ms = 1_000_000, 5_000
    for t_ms in range(start_ms, start_ms + 400_000, step_ms):
        batch = FeatureBatch.packed(["job"] * len(workers), workers, ["n0"] * len(workers),
                                    np.full(len(workers), t_ms, dtype=np.int64),
                                    {"heartbeat_age_s": np.full(len(workers), 1.0)})
        for command in engine.evaluate_batch(batch).commands:
            fired.setdefault(command.target.worker_id, []).append(command.event_time_ms)
    assert sorted(fired) == sorted(workers)
    assert {times[0] for times in fired.values()} == {start_ms}  # at first sight, all
    cooldown_ms, jitter_ms = spec.cooldown_s * 1000, spec.jitter_s * 1000
    gaps = [b - a for times in fired.values() for a, b in pairwise(times)]
    assert min(gaps) >= cooldown_ms and max(gaps) < cooldown_ms + jitter_ms + step_ms
    # The second round spreads over the steps the jitter spans: about a third of the fleet
    # at each of 80, 85 and 90 s (75 s only for a draw of 0).
    at_ms, counts = np.unique([times[1] - start_ms for times in fired.values()],
                              return_counts=True)
    assert set(at_ms.tolist()) <= {75_000, 80_000, 85_000, 90_000}
    assert sorted(at_ms[counts > 0.28 * len(workers)].tolist()) == [80_000, 85_000, 90_000]
