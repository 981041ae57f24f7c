"""The engine on feature traces, as pure functions: every built-in policy fires on a trace
made to trigger it and stays quiet on a healthy one; priorities, dry-run, meta-policies."""

from __future__ import annotations

import pytest
from feature_values import GIB, HEALTHY, STUCK

from dsec.policy_engine.builtin import load_builtin_policies
from dsec.policy_engine.engine import render_alert
from dsec.policy_engine.trace import replay
from dsec.schemas import FeatureEvent, PolicySpec, WorkerIdentity
from dsec.schemas.policies import DecisionKind

# What makes each built-in policy fire; periodic-snapshot fires on any live worker, so
# its quiet trace is a silent one.
TRIGGERS = {
    "bandwidth-latency-breaker": {"grad_sync_latency_p95_ms": 120.0},
    "elastic-memory-quota": {"gpu_process_memory_bytes": 13.0 * GIB},
    "stuck-episode": STUCK,
    "precision-downgrade": {"grad_nonfinite_count": 2.0},
    "periodic-snapshot": {},
    "gpu-degradation-snapshot": {"gpu_thermal_throttled": 1.0},
    "worker-lost": {"worker_lost": 1.0, "heartbeat_age_s": 20.0},
    "worker-stalled": {"step_stalled_heartbeats": 6.0, "step_stalled_s": 12.0},
    "reward-variance-jump": {"reward_volatility_chance_per_h": 1e-4},
    "meta-breaker-trips": {"breaker_trips_per_hour": 5.0},
    "meta-snapshot-recovery": {"snapshot_recovery_time_s": 12.0},
    "meta-pool-utilisation": {"pool_utilisation_rate": 0.2},
    "runtime-latency-backoff": {"runtime_call_latency_ms": 2500.0},
}
QUIET = {"periodic-snapshot": {"heartbeat_age_s": 60.0}}


def trace(features: dict, seconds: int, step_s: int = 5, worker: str = "w1",
          tags: dict | None = None, start_ms: int = 1_000_000) -> list[FeatureEvent]:
    identity = WorkerIdentity(job_id="job", worker_id=worker, node_id="node-1")
    return [FeatureEvent(identity=identity, event_time_ms=start_ms + t * 1000,
                         features=features, tags=tags or {"episode_end_reason": "collision"},
                         gpu_uuid="GPU-1")
            for t in range(0, seconds, step_s)]


def _pack(name: str) -> list[PolicySpec]:
    pack = {p.name: p for p in load_builtin_policies()}
    chosen = [pack[name]]
    if pack[name].tune is not None:
        chosen.append(pack[pack[name].tune.policy])
    return chosen


def _acted(decisions, name: str) -> list:
    return [d for d in decisions if d.policy_name == name
            and d.decision in (DecisionKind.FIRED, DecisionKind.STAGED_UP)]


def test_every_builtin_policy_has_a_trigger() -> None:
    assert {p.name for p in load_builtin_policies()} == set(TRIGGERS)


@pytest.mark.parametrize("name", sorted(TRIGGERS))
def test_builtin_policy_fires_on_its_trigger_and_not_when_healthy(name: str) -> None:
    seconds = 3 * 3600 if name == "meta-pool-utilisation" else 120
    fired = replay(_pack(name), trace({**HEALTHY, **TRIGGERS[name]}, seconds, step_s=60
                                      if seconds > 3600 else 5))
    assert _acted(fired.output.decisions, name), name
    quiet = replay(_pack(name), trace({**HEALTHY, **QUIET.get(name, {})}, seconds))
    assert not [d for d in quiet.output.decisions if d.policy_name == name], name
    assert not [c for c in quiet.output.commands if c.policy_name == name], name


def test_events_without_a_policys_features_leave_its_for_timer_running() -> None:
    # Feature events carry what their batch updated: sync features in some, episode
    # features in others. The breaker's 10 s `for:` must still see 10 s of slow syncs.
    slow_syncs = trace({"grad_sync_latency_p95_ms": 120.0, "grad_sync_bytes_per_s": 50e6},
                       30, step_s=2)
    episodes_only = trace({"reward_episodes": 20.0, "episode_same_end_streak": 1.0}, 30,
                          step_s=2, start_ms=1_000_000 + 1000)
    interleaved = sorted(slow_syncs + episodes_only, key=lambda e: e.event_time_ms)
    result = replay(_pack("bandwidth-latency-breaker"), interleaved)
    fired = _acted(result.output.decisions, "bandwidth-latency-breaker")
    assert fired and fired[0].event_time_ms - 1_000_000 >= 10_000


def test_breaker_walks_up_three_stages_and_back_down() -> None:
    over = trace({**HEALTHY, "grad_sync_latency_p95_ms": 120.0}, 200)
    calm = trace(HEALTHY, 400, start_ms=1_000_000 + 200_000)
    result = replay(_pack("bandwidth-latency-breaker"), over + calm)
    kinds = [(d.decision, d.stage) for d in result.output.decisions]
    assert kinds == [
        (DecisionKind.FIRED, 1), (DecisionKind.STAGED_UP, 2), (DecisionKind.STAGED_UP, 3),
        (DecisionKind.STAGED_DOWN, 2), (DecisionKind.STAGED_DOWN, 1),
        (DecisionKind.STAGED_DOWN, 0),
    ]
    actions = [c.action.model_dump(mode="json") for c in result.output.commands]
    assert actions == [
        {"kind": "grad_compression", "bits": 4}, {"kind": "grad_accumulation", "steps": 4},
        {"kind": "sampler", "paused": True}, {"kind": "sampler", "paused": False},
        # undone to the worker's own settings, whatever they were
        {"kind": "grad_accumulation", "steps": "original"},
        {"kind": "grad_compression", "bits": "original"},
    ]
    assert len({c.actuation_id for c in result.output.commands}) == 6
    assert all(c.target.node_id == "node-1" and c.policy_version == 2
               and c.expires_at_ms > c.event_time_ms for c in result.output.commands)


def test_breaker_third_stage_needs_latency_still_over() -> None:
    over = trace({**HEALTHY, "grad_sync_bytes_per_s": 400e6}, 300)  # bandwidth only
    result = replay(_pack("bandwidth-latency-breaker"), over)
    assert max(d.stage for d in result.output.decisions) == 2


def test_breaker_does_not_flap_on_a_noisy_signal() -> None:
    import random

    rng = random.Random(3)
    events = []
    for i, event in enumerate(trace(HEALTHY, 1800)):
        latency = rng.uniform(70.0, 100.0)  # around the 85 ms cap, above the 68 ms exit
        events.append(event.model_copy(update={
            "features": {**HEALTHY, "grad_sync_latency_p95_ms": latency},
            "event_time_ms": event.event_time_ms + i}))
    result = replay(_pack("bandwidth-latency-breaker"), events)
    kinds = [d.decision for d in result.output.decisions]
    assert DecisionKind.STAGED_DOWN not in kinds
    assert len(result.output.commands) <= 3


def test_stuck_episode_alert_names_the_worker_and_where() -> None:
    result = replay(_pack("stuck-episode"),
                    trace({**HEALTHY, **STUCK}, 10, worker="42"))
    assert "alert Agent_42_episode_stuck_collision_3x" in result.output.decisions[0].detail
    assert {c.action.model_dump(mode="json")["kind"] for c in result.output.commands} == {
        "memory_cap", "sync_priority"}
    assert result.output.commands[0].action.limit_bytes == 4 * GIB


def test_meta_policy_publishes_a_tuned_version() -> None:
    result = replay(_pack("meta-breaker-trips"),
                    trace({**HEALTHY, "breaker_trips_per_hour": 5.0}, 10))
    (published,) = result.output.policies
    assert published.name == "bandwidth-latency-breaker" and published.version == 3
    assert published.params["latency_cap_ms"] == 75 and published.signature


def test_higher_priority_holds_the_knob() -> None:
    pack = {p.name: p for p in load_builtin_policies()}
    features = {**HEALTHY, "worker_lost": 1.0, **STUCK}
    result = replay([pack["worker-lost"], pack["stuck-episode"]], trace(features, 10))
    by_kind = {(c.policy_name, c.action.kind) for c in result.output.commands}
    assert ("worker-lost", "sync_priority") in by_kind
    assert ("stuck-episode", "sync_priority") not in by_kind
    assert ("stuck-episode", "memory_cap") in by_kind
    assert any(d.decision is DecisionKind.SUPPRESSED_PRIORITY for d in result.output.decisions)


def test_dry_run_is_audited_and_emits_nothing() -> None:
    policy = _pack("stuck-episode")[0].model_copy(update={"dry_run": True})
    result = replay([policy], trace({**HEALTHY, **STUCK}, 10))
    assert not result.output.commands
    assert [d.decision for d in result.output.decisions] == [DecisionKind.DRY_RUN]
    assert "would apply stage 1" in result.output.decisions[0].detail


def test_selector_limits_the_targets() -> None:
    base = _pack("stuck-episode")[0]
    policy = PolicySpec.model_validate({**base.model_dump(mode="json", exclude_none=True),
                                        "selector": {"pools": ["a100-pool"]}})
    features = {**HEALTHY, **STUCK}
    other = trace(features, 10, worker="w1", tags={"pool": "h100-pool"})
    mine = trace(features, 10, worker="w2", tags={"pool": "a100-pool"})
    result = replay([policy], other + mine)
    assert {c.target.worker_id for c in result.output.commands} == {"w2"}


def test_alert_template_runs_nothing() -> None:
    event = trace(HEALTHY, 1, tags={"x": "y"})[0]
    spec = _pack("stuck-episode")[0]
    assert render_alert("{__class__}{x}{worker_id}", spec, event) == "unknownyw1"


def test_batches_and_single_events_decide_alike() -> None:
    events = (trace({**HEALTHY, "grad_sync_latency_p95_ms": 120.0}, 200)
              + trace(HEALTHY, 400, start_ms=1_200_000)
              + trace({**HEALTHY, **STUCK}, 100, worker="w2"))
    pack = load_builtin_policies()
    one = replay(pack, events, batch_size=1)
    many = replay(pack, events, batch_size=64)
    assert len(one.output.commands) > 6
    assert sorted(c.actuation_id for c in one.output.commands) == sorted(
        c.actuation_id for c in many.output.commands)


def test_a_deferred_claim_takes_effect_when_the_holder_lets_go() -> None:
    pack = {p.name: p for p in load_builtin_policies()}
    lost = {**HEALTHY, "worker_lost": 1.0, **STUCK}
    back = {**HEALTHY, **STUCK}
    events = trace(lost, 10) + trace(back, 60, start_ms=1_010_000)
    result = replay([pack["worker-lost"], pack["stuck-episode"]], events)
    sync = [(c.policy_name, c.action.level) for c in result.output.commands
            if c.action.kind == "sync_priority"]
    # worker-lost (400) holds the knob; stuck-episode's -1 waits, then resumes, not 0
    assert sync == [("worker-lost", -3), ("stuck-episode", -1)]


def test_a_one_shot_claim_holds_while_its_command_is_valid() -> None:
    from keys import KEYRING, VERIFIER

    from dsec.policy_engine.engine import Engine
    from dsec.policy_engine.registry import PolicyRegistry

    registry = PolicyRegistry(VERIFIER)
    nudge = KEYRING.sign(PolicySpec.model_validate({
        "name": "nudge", "condition": "worker_lost >= 1.0", "priority": 900,
        "cooldown_s": 3600, "action": {"params": {"kind": "sync_priority", "level": 1},
                                       "ttl_s": 30}}))
    low = KEYRING.sign(PolicySpec.model_validate({
        "name": "low", "condition": "episode_same_end_streak >= 3.0", "priority": 1,
        "stages": [{"actions": [{"kind": "sync_priority", "level": -1}]}]}))
    registry.install(nudge)
    registry.install(low)
    engine = Engine(registry, {}, {}, KEYRING)
    first = engine.evaluate(trace({**HEALTHY, "worker_lost": 1.0}, 5))
    during = engine.evaluate(trace({**HEALTHY, **STUCK}, 5,
                                   worker="w1", start_ms=1_010_000))
    assert [c.policy_name for c in first.commands] == ["nudge"]
    assert not during.commands
    assert during.decisions[0].decision is DecisionKind.SUPPRESSED_PRIORITY
    engine.states.clear()
    engine.forget_cached()  # the states changed behind the engine's back
    after = engine.evaluate(trace({**HEALTHY, **STUCK}, 5,
                                  worker="w1", start_ms=1_100_000))
    assert [c.policy_name for c in after.commands] == ["low"]


def test_a_deferred_claim_takes_effect_when_the_claim_above_lapses() -> None:
    from keys import KEYRING, VERIFIER

    from dsec.policy_engine.engine import Engine
    from dsec.policy_engine.registry import PolicyRegistry

    registry = PolicyRegistry(VERIFIER)
    nudge = KEYRING.sign(PolicySpec.model_validate({
        "name": "nudge", "condition": "worker_lost >= 1.0", "priority": 900,
        "cooldown_s": 3600, "action": {"params": {"kind": "sync_priority", "level": 1},
                                       "ttl_s": 30}}))
    # held while its condition holds, undone after: it never fires twice on its own
    low = KEYRING.sign(PolicySpec.model_validate({
        "name": "low", "condition": "episode_same_end_streak >= 3.0", "priority": 1,
        "stages": [{"actions": [{"kind": "sync_priority", "level": -1}],
                    "undo": [{"kind": "sync_priority", "level": 0}]}]}))
    registry.install(nudge)
    registry.install(low)
    engine = Engine(registry, {}, {}, KEYRING)
    stuck = {**HEALTHY, **STUCK}
    first = engine.evaluate(trace({**stuck, "worker_lost": 1.0}, 5))
    during = engine.evaluate(trace(stuck, 20, start_ms=1_005_000))
    assert [c.policy_name for c in first.commands] == ["nudge"] and not during.commands
    after = engine.evaluate(trace(stuck, 20, start_ms=1_040_000))  # nudge's 30 s are over
    (resumed,) = after.commands
    assert resumed.policy_name == "low" and resumed.action.level == -1
    assert "resumes sync_priority" in resumed.reason
    assert not engine.evaluate(trace(stuck, 20, start_ms=1_060_000)).commands


def test_a_policy_that_fails_at_run_time_is_reported_once_and_the_others_go_on() -> None:
    odd = PolicySpec.model_validate({
        "name": "odd", "condition": "size('abc') > 0 ? worker_lost : 1.0",  # not a bool
        "action": {"params": {"kind": "snapshot"}}})
    pack = {p.name: p for p in load_builtin_policies()}
    result = replay([odd, pack["worker-lost"]], trace({**HEALTHY, "worker_lost": 1.0}, 20))
    errors = [d for d in result.output.decisions if d.decision is DecisionKind.EVALUATION_ERROR]
    assert len(errors) == 1 and errors[0].policy_name == "odd"
    assert [c.policy_name for c in result.output.commands] == ["worker-lost"]


def test_the_memory_quota_is_the_workers_own_memory_not_the_cards() -> None:
    # Two healthy workers of 6.5 GiB share a card of 13 GiB: over the ceiling card-wide.
    shared = replay(_pack("elastic-memory-quota"), trace(HEALTHY, 60, worker="a")
                    + trace(HEALTHY, 60, worker="b"))
    assert not shared.output.commands
    # A worker whose own memory passes the ceiling, on a card it alone samples or not.
    leaking = {**HEALTHY, "gpu_process_memory_bytes": 12.5 * GIB,
               "gpu_memory_used_bytes": 40.0 * GIB}
    fired = replay(_pack("elastic-memory-quota"), trace(leaking, 30, worker="leaky")
                   + trace(HEALTHY, 30, worker="b"))
    assert {c.target.worker_id for c in fired.output.commands} == {"leaky"}


def test_a_run_of_the_workers_usual_ending_is_not_stuck() -> None:
    # Ten time limits in a row, where most of its episodes end by the time limit.
    usual = {**HEALTHY, "episode_same_end_streak": 10.0, "episode_end_streak_chance_per_h": 3.0}
    assert not replay(_pack("stuck-episode"), trace(usual, 600)).output.decisions


def test_the_stuck_alert_says_the_run_it_saw() -> None:
    seen = {**HEALTHY, **STUCK, "episode_same_end_streak": 5.0}
    result = replay(_pack("stuck-episode"), trace(seen, 10, worker="42"))
    assert "alert Agent_42_episode_stuck_collision_5x" in result.output.decisions[0].detail


def test_a_card_that_throttles_snapshots_workers_that_do_not_sample_it() -> None:
    told = {**HEALTHY, "card_thermal_throttled": 1.0}
    result = replay(_pack("gpu-degradation-snapshot"), trace(told, 10, worker="quiet-one"))
    assert [c.action.kind for c in result.output.commands] == ["snapshot"]


def test_gpu_alert_names_the_gpu_and_resolves_once_the_condition_clears() -> None:
    throttling = {"gpu_thermal_throttle_events": 2.0, "gpu_thermal_throttled": 1.0}
    hot = trace({**HEALTHY, **throttling}, 20,
                tags={"gpu_model": "NVIDIA H100"})
    cool = trace(HEALTHY, 20, start_ms=1_000_000 + 20_000)
    result = replay(_pack("gpu-degradation-snapshot"), hot + cool + cool)
    decisions = [(d.decision, d.alert) for d in result.output.decisions]
    assert decisions == [(DecisionKind.FIRED, "GPU_GPU-1_degraded"),
                         (DecisionKind.SUPPRESSED_COOLDOWN, "GPU_GPU-1_degraded"),
                         (DecisionKind.RESOLVED, "GPU_GPU-1_degraded")]
    fired = result.output.decisions[0]
    assert (fired.gpu_uuid, fired.gpu_model) == ("GPU-1", "NVIDIA H100")


def test_a_staged_alert_is_resolved_by_coming_down_not_by_a_resolution_of_its_own() -> None:
    stuck = trace({**HEALTHY, **STUCK}, 10)
    calm = trace(HEALTHY, 200, start_ms=1_000_000 + 10_000)
    result = replay(_pack("stuck-episode"), stuck + calm)
    kinds = [d.decision for d in result.output.decisions]
    assert DecisionKind.RESOLVED not in kinds
    assert kinds[-1] is DecisionKind.STAGED_DOWN
    # Each decision names the run it saw; the alert tracker ends the firing by its labels.
    assert result.output.decisions[0].alert == "Agent_w1_episode_stuck_collision_3x"
    assert result.output.decisions[-1].alert == "Agent_w1_episode_stuck_collision_1x"
