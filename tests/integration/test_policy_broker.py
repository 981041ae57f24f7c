"""The policy engine on the real broker, as its own process: the built-in pack on traces,
restarts without duplicates, policies published as events (hot reload, rejections,
dry-run, delete)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from feature_values import GIB, HEALTHY, STUCK
from policy_broker import EngineProcess, Rig, env_for, trace

from dsec.infra.keys import signer_for
from dsec.infra.topics import ensure_topics
from dsec.schemas import PolicySpec, encode, now_ms
from dsec.schemas.policies import DecisionKind
from dsec.schemas.trust import KeyRole

pytestmark = pytest.mark.integration

TRIGGERS = {
    "bandwidth-latency-breaker": {"grad_sync_latency_p95_ms": 120.0},
    "elastic-memory-quota": {"gpu_process_memory_bytes": 13.0 * GIB},
    "stuck-episode": STUCK,
    "precision-downgrade": {"grad_nonfinite_count": 2.0},
    "gpu-degradation-snapshot": {"gpu_thermal_throttled": 1.0},
    "worker-lost": {"worker_lost": 1.0, "heartbeat_age_s": 20.0},
    "reward-variance-jump": {"reward_volatility_chance_per_h": 1e-4},
    "meta-breaker-trips": {"breaker_trips_per_hour": 5.0},
    "meta-snapshot-recovery": {"snapshot_recovery_time_s": 12.0},
    "meta-pool-utilisation": {"pool_utilisation_rate": 0.2},
    "runtime-latency-backoff": {"runtime_call_latency_ms": 2500.0},
}
ACTED = {DecisionKind.FIRED, DecisionKind.STAGED_UP}


@pytest.fixture
def rig(settings, tmp_path):
    ensure_topics(settings)
    rig = Rig(settings)
    engine = EngineProcess(settings, tmp_path / "engine.log").start()
    rig.engine = engine
    try:
        rig.decisions.wait(lambda items: not engine.alive() or any(
            d.decision is DecisionKind.POLICY_ACCEPTED for d in items), 90, "the engine")
        assert engine.alive(), (tmp_path / "engine.log").read_text()[-3000:]
        yield rig
    finally:
        engine.stop()
        rig.close()
        print((tmp_path / "engine.log").read_text()[-3000:])


def test_builtin_pack_fires_on_its_triggers_and_stays_quiet_when_healthy(rig) -> None:
    start = now_ms() - 3 * 3600_000
    events = []
    for name, trigger in TRIGGERS.items():
        if name == "meta-pool-utilisation":  # for: 2 h
            events += trace({**HEALTHY, **trigger}, 2 * 3600 + 120, name, start, step_s=600)
        elif name == "bandwidth-latency-breaker":  # up three stages, then back down
            events += trace({**HEALTHY, **trigger}, 200, name, start)
            events += trace(HEALTHY, 400, name, start + 200_000)
        else:
            events += trace({**HEALTHY, **trigger}, 30, name, start)
    events += trace({**HEALTHY, "heartbeat_age_s": 60.0}, 600, "healthy", start)
    rig.send(events)

    def all_acted(decisions) -> bool:
        acted = {(d.policy_name, d.identity.worker_id) for d in decisions
                 if d.identity and d.decision in ACTED}
        breaker_down = [d for d in decisions if d.policy_name == "bandwidth-latency-breaker"
                        and d.decision is DecisionKind.STAGED_DOWN]
        missing = [n for n in TRIGGERS if (n, n) not in acted]
        if missing != waiting[-1:]:
            waiting.append(missing)
            print("still waiting for", missing, "breaker down", len(breaker_down))
        return not missing and len(breaker_down) == 3

    waiting: list = []

    decisions = rig.decisions.wait(all_acted, 120, "every built-in policy to act")
    assert not [d for d in decisions if d.identity and d.identity.worker_id == "healthy"]
    commands = rig.commands.drain(2.0)
    assert not [c for c in commands if c.target.worker_id == "healthy"]
    breaker = [c.action.model_dump(mode="json") for c in commands
               if c.policy_name == "bandwidth-latency-breaker"]
    assert breaker == [
        {"kind": "grad_compression", "bits": 4}, {"kind": "grad_accumulation", "steps": 4},
        {"kind": "sampler", "paused": True}, {"kind": "sampler", "paused": False},
        {"kind": "grad_accumulation", "steps": "original"},
        {"kind": "grad_compression", "bits": "original"},
    ]
    assert all(c.target.node_id == f"node-{c.target.worker_id}" and c.signature
               for c in commands)
    # meta-policies publish new versions of the policies they tune, on the policies topic
    published = {key.decode(): PolicySpec.model_validate_json(value)
                 for key, value in rig.policies.drain(2.0) if value}
    assert published["bandwidth-latency-breaker"].params["latency_cap_ms"] == 75
    assert published["periodic-snapshot"].params["compression_level"] == 6
    assert published["elastic-memory-quota"].params["base_quota_bytes"] == 6.5 * GIB
    rig.decisions.wait(lambda items: {
        d.policy_name for d in items
        if d.decision is DecisionKind.POLICY_ACCEPTED and d.policy_version == 2
    } >= {"bandwidth-latency-breaker", "periodic-snapshot", "elastic-memory-quota"},
        30, "the tuned versions to be running")


def test_restart_continues_a_timer_and_a_staged_policy_without_duplicates(rig) -> None:
    start = now_ms() - 3600_000
    over = {**HEALTHY, "grad_sync_latency_p95_ms": 120.0, "heartbeat_age_s": 60.0}
    rig.send(trace(over, 10, "pending", start)          # t=0, 5: for: 10 s not yet met
             + trace(over, 15, "staged", start))        # t=0..10: fires stage 1
    rig.decisions.wait(lambda items: any(
        d.identity and d.identity.worker_id == "staged" and d.decision is DecisionKind.FIRED
        for d in items), 60, "stage 1 before the restart")
    rig.engine.stop()
    rig.engine.start()
    rig.send(trace(over, 5, "pending", start + 10_000)       # t=10: the timer ran 10 s
             + trace(over, 35, "staged", start + 15_000))    # t=15..45: stage 2 at t=40

    def done(items) -> bool:
        kinds = {(d.identity.worker_id, d.decision) for d in items if d.identity}
        return {("pending", DecisionKind.FIRED), ("staged", DecisionKind.STAGED_UP)} <= kinds

    decisions = rig.decisions.wait(done, 120, "the timer and the stage to carry on")
    fired = [d for d in decisions if d.identity and d.decision is DecisionKind.FIRED]
    assert sorted(d.identity.worker_id for d in fired) == ["pending", "staged"]
    assert next(d for d in fired if d.identity.worker_id == "pending").event_time_ms == (
        start + 10_000)
    commands = rig.commands.drain(2.0)
    staged = [c for c in commands if c.target.worker_id == "staged"]
    assert [c.action.kind for c in staged] == ["grad_compression", "grad_accumulation"]
    assert len({c.actuation_id for c in commands}) == len(commands)


def _custom(**changes) -> PolicySpec:
    return PolicySpec.model_validate({
        "name": "custom-temperature", "version": 1, "condition": "gpu_temperature_c > 90.0",
        "cooldown_s": 600, "action": {"params": {"kind": "snapshot"}}, **changes,
    })


def test_published_policies_hot_reload_rejections_dry_run_and_delete(rig, tmp_path) -> None:
    settings = rig.settings
    hot = {"gpu_temperature_c": 95.0}
    path = tmp_path / "custom.yaml"
    path.write_text("name: custom-temperature\nversion: 1\n"
                    "condition: gpu_temperature_c > 90.0\ncooldown_s: 600\n"
                    "action: {params: {kind: snapshot}}\n")
    subprocess.run([sys.executable, "-m", "dsec.cli", "policy", "publish", str(path)],
                   env=env_for(settings), check=True, timeout=60)
    rig.decisions.wait(lambda items: any(
        d.policy_name == "custom-temperature" and d.decision is DecisionKind.POLICY_ACCEPTED
        for d in items), 60, "the custom policy to load")
    listed = subprocess.run([sys.executable, "-m", "dsec.cli", "policy", "list", "--json"],
                            env=env_for(settings), check=True, timeout=60,
                            capture_output=True, text=True)
    running = {p["name"]: p for p in json.loads(listed.stdout)["policies"]}
    assert running["custom-temperature"]["source"] == "topic"
    assert running["bandwidth-latency-breaker"]["source"] == "built-in"
    rig.send(trace(hot, 5, "hot", now_ms()))
    rig.commands.wait(lambda items: any(c.policy_name == "custom-temperature" for c in items),
                      60, "the custom policy to act")

    publisher = signer_for(settings, KeyRole.POLICY_PUBLISHER)
    tampered = publisher.sign(_custom(version=2)).model_copy(
        update={"condition": "gpu_temperature_c > 0.0"})
    rig.raw_policy(b"custom-temperature", encode(tampered))
    rig.raw_policy(b"broken", b'{"name": "broken", "condition": ')
    unsigned = _custom(name="unsigned")
    rig.raw_policy(b"unsigned", encode(unsigned))
    shadow = publisher.sign(_custom(name="shadow", condition="gpu_temperature_c > 50.0",
                                    dry_run=True))
    rig.raw_policy(b"shadow", encode(shadow))

    def rejected(items) -> dict:
        found = {d.policy_name: d.detail for d in items
                 if d.decision is DecisionKind.POLICY_REJECTED}
        return found if len(found) >= 3 else {}

    reasons = rig.decisions.wait(rejected, 60, "three rejections")
    assert "signature does not match" in reasons["custom-temperature"]
    assert "unsigned" in reasons["unsigned"]
    assert "broken" in reasons
    rig.decisions.wait(lambda items: any(
        d.policy_name == "shadow" and d.decision is DecisionKind.POLICY_ACCEPTED
        for d in items), 60, "the dry-run policy to load")

    rig.send(trace(hot, 5, "warm", now_ms()))
    rig.decisions.wait(lambda items: any(
        d.policy_name == "shadow" and d.decision is DecisionKind.DRY_RUN for d in items),
        60, "the dry-run decision")
    # the running v1 was not replaced by the tampered v2, and it still acts
    rig.commands.wait(lambda items: any(c.policy_name == "custom-temperature"
                                        and c.target.worker_id == "warm" for c in items),
                      60, "v1 to act on the second worker")
    commands = rig.commands.drain(1.0)
    assert not [c for c in commands if c.policy_name == "shadow"]
    assert {c.policy_version for c in commands if c.policy_name == "custom-temperature"} == {1}

    subprocess.run([sys.executable, "-m", "dsec.cli", "policy", "delete", "custom-temperature"],
                   env=env_for(settings), check=True, timeout=60)
    rig.decisions.wait(lambda items: any(
        d.policy_name == "custom-temperature" and d.decision is DecisionKind.POLICY_DELETED
        for d in items), 60, "the delete")
