from __future__ import annotations

import itertools

import pytest

from dsec.policy_engine import (
    CompiledCondition,
    ConditionError,
    PolicyState,
    decide,
    load_builtin_policies,
)
from dsec.schemas import PolicySpec
from dsec.schemas.policies import DecisionKind


def _policy(**changes: object) -> PolicySpec:
    base = {"name": "p", "condition": "x > 1.0", "for_s": 10, "cooldown_s": 60,
            "action": {"params": {"kind": "snapshot"}}}
    return PolicySpec.model_validate({**base, **changes})


def test_for_duration_then_fire_then_cooldown() -> None:
    policy = _policy()
    state, decision = decide(policy, PolicyState(), True, 0)
    assert decision is None and state.pending_since_ms == 0
    state, decision = decide(policy, state, True, 9_999)
    assert decision is None
    state, decision = decide(policy, state, True, 10_000)
    assert decision is DecisionKind.FIRED and state.last_fired_ms == 10_000
    state, decision = decide(policy, state, True, 20_000)
    assert decision is DecisionKind.SUPPRESSED_COOLDOWN
    state, decision = decide(policy, state, True, 21_000)
    assert decision is None  # suppression is audited once per episode of cooling
    state, decision = decide(policy, state, True, 70_000)
    assert decision is DecisionKind.FIRED


def test_clearing_resets_the_timer() -> None:
    policy = _policy()
    state, _ = decide(policy, PolicyState(), True, 0)
    state, _ = decide(policy, state, False, 5_000)
    assert state.pending_since_ms is None
    state, decision = decide(policy, state, True, 12_000)
    assert decision is None and state.pending_since_ms == 12_000


def test_dry_run_is_a_decision_not_a_command() -> None:
    _state, decision = decide(_policy(for_s=0, dry_run=True), PolicyState(), True, 0)
    assert decision is DecisionKind.DRY_RUN


def test_state_round_trips_through_json() -> None:
    state = PolicyState(pending_since_ms=1, last_fired_ms=2, suppressed_audited=True)
    assert PolicyState.from_json(state.to_json()) == state
    assert PolicyState.from_json(None) == PolicyState()


def test_conditions_are_cel() -> None:
    condition = CompiledCondition("reward_episodes >= 20.0 && reward_variance_jump_ratio > 4.0")
    assert condition.holds({"reward_episodes": 20.0, "reward_variance_jump_ratio": 5.0})
    assert not condition.holds({"reward_episodes": 20.0, "reward_variance_jump_ratio": 3.0})
    assert not condition.holds({"reward_episodes": 20.0})  # missing feature: does not hold


def test_conditions_refuse_what_is_not_cel_or_not_boolean(tmp_path) -> None:
    with pytest.raises(ConditionError):
        CompiledCondition("x > 1.0 &&")
    marker = tmp_path / "touched"
    hostile = CompiledCondition(f"__import__('os').system('touch {marker}') == 0")
    assert not hostile.holds({"x": 1.0})  # CEL has no such function: nothing runs
    assert not marker.exists()
    with pytest.raises(ConditionError, match="not bool"):
        CompiledCondition("x + 1.0").holds({"x": 1.0})


def test_builtin_pack_loads() -> None:
    policies = load_builtin_policies()
    assert "reward-variance-jump" in [p.name for p in policies]
    for policy in policies:
        CompiledCondition(policy.condition)


def _staged(**changes: object) -> PolicySpec:
    stage = {"actions": [{"kind": "grad_compression", "bits": 4}],
             "undo": [{"kind": "grad_compression", "bits": 8}]}
    base = {"name": "s", "condition": "x > 10.0", "exit_condition": "x < 5.0", "for_s": 10,
            "cooldown_s": 0, "stage_interval_s": 20, "hold_s": 30,
            "stages": [stage, stage, stage]}
    return PolicySpec.model_validate({**base, **changes})


def _walk(policy: PolicySpec, signal: list[float], step_ms: int = 5_000):
    state, kinds, stages = PolicyState(), [], []
    for i, x in enumerate(signal):
        state, kind = decide(policy, state, x > 10.0, i * step_ms, exit_holds=x < 5.0)
        kinds.append(kind)
        stages.append(state.stage)
    return state, kinds, stages


def test_stages_climb_while_holding_and_come_down_one_per_hold() -> None:
    policy = _staged()
    state, kinds, stages = _walk(policy, [20.0] * 20 + [1.0] * 30)
    climbed = [k for k in kinds[:20] if k]
    assert climbed == [DecisionKind.FIRED, DecisionKind.STAGED_UP, DecisionKind.STAGED_UP]
    assert max(stages) == 3
    came_down = [k for k in kinds[20:] if k]
    assert came_down == [DecisionKind.STAGED_DOWN] * 3
    assert state.stage == 0 and stages[-1] == 0
    # each step down waited the hold time (30 s = 6 samples of 5 s)
    downs = [i for i, k in enumerate(kinds) if k is DecisionKind.STAGED_DOWN]
    assert [b - a for a, b in itertools.pairwise(downs)] == [6, 6]


def test_noise_inside_the_hysteresis_band_never_flaps() -> None:
    import random

    rng = random.Random(7)
    policy = _staged()
    noisy = [rng.uniform(6.0, 14.0) for _ in range(200)]  # crosses enter, never reaches exit
    _state, kinds, stages = _walk(policy, noisy)
    assert DecisionKind.STAGED_DOWN not in kinds
    assert stages == sorted(stages)  # only ever climbs


def test_one_shot_policy_keeps_old_semantics() -> None:
    assert _policy().one_shot and not _staged().one_shot


def test_dry_run_walks_stages_but_only_says_so() -> None:
    _state, kinds, stages = _walk(_staged(dry_run=True), [20.0] * 20)
    assert [k for k in kinds if k] == [DecisionKind.DRY_RUN] * 3 and max(stages) == 3
