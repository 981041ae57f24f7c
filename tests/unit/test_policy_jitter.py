"""A policy's ``jitter_s``: each gap between a target's fires is the cooldown plus a wait
drawn from the target and its last fire, so targets that fired together drift apart."""

from __future__ import annotations

import numpy as np

from dsec.policy_engine import PolicyState, decide
from dsec.policy_engine.jitter import cooldown_jitter_ms, target_hash
from dsec.schemas import PolicySpec
from dsec.schemas.policies import DecisionKind

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
