"""Policies checked before they run: shape, bounds, CEL, signature, version."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from keys import EXPIRES_AT_MS, FORGER, KEYRING, PRIVATE_KEYS, VERIFIER
from typer.testing import CliRunner

from dsec.policy_engine.builtin import load_builtin_policies
from dsec.policy_engine.registry import PolicyRegistry, PolicyRejected, parse_policy
from dsec.schemas import PolicyDeletion, PolicySpec, encode
from dsec.schemas.policies import DecisionKind
from dsec.schemas.signing import Ed25519Signer
from dsec.schemas.trust import KeyRole

GIB = 1 << 30


def _spec(**changes: object) -> PolicySpec:
    base = {"name": "p", "condition": "gpu_temperature_c > 90.0",
            "action": {"params": {"kind": "snapshot"}}}
    return PolicySpec.model_validate({**base, **changes})


def test_accepts_signed_and_refuses_unsigned_or_tampered() -> None:
    registry = PolicyRegistry(VERIFIER)
    assert registry.install(_spec()).decision is DecisionKind.POLICY_REJECTED
    signed = KEYRING.sign(_spec())
    assert registry.install(signed).decision is DecisionKind.POLICY_ACCEPTED
    tampered = KEYRING.sign(_spec(version=2)).model_copy(update={"condition": "true"})
    record = registry.install(tampered)
    assert record.decision is DecisionKind.POLICY_REJECTED
    assert "does not match" in record.detail
    assert registry.get("p").version == 1
    assert registry.install(FORGER.sign(_spec())).decision is (
        DecisionKind.POLICY_REJECTED)


def test_versions_only_move_forward_and_replays_are_quiet() -> None:
    registry = PolicyRegistry(VERIFIER)
    registry.install(KEYRING.sign(_spec(version=2)))
    assert registry.install(KEYRING.sign(_spec(version=2))) is None  # replayed record
    stale = registry.install(KEYRING.sign(_spec(version=1)))
    assert stale.decision is DecisionKind.POLICY_REJECTED and "not newer" in stale.detail
    registry.install(KEYRING.sign(_spec(version=3, priority=7)))
    assert registry.versions("p") == [2, 3] and registry.get("p").priority == 7


def test_topic_records_malformed_misnamed_and_deletions() -> None:
    registry = PolicyRegistry(VERIFIER)
    assert registry.offer(b"x", b'{"name": ').decision is DecisionKind.POLICY_REJECTED
    misnamed = registry.offer(b"q", encode(KEYRING.sign(_spec())))
    assert misnamed.decision is DecisionKind.POLICY_REJECTED and "named 'p'" in misnamed.detail
    bad_cel = KEYRING.sign(_spec(condition="gpu_temperature_c >"))
    assert registry.offer(b"p", encode(bad_cel)).decision is DecisionKind.POLICY_REJECTED
    assert registry.offer(b"p", encode(KEYRING.sign(_spec()))).decision is (
        DecisionKind.POLICY_ACCEPTED)
    deletion = encode(KEYRING.sign(PolicyDeletion(deletes="p", up_to_version=1)))
    assert registry.offer(b"p", deletion).decision is DecisionKind.POLICY_DELETED
    assert registry.get("p") is None and registry.offer(b"p", deletion) is None


def test_a_command_signer_key_publishes_no_policy() -> None:
    engine_key = Ed25519Signer(PRIVATE_KEYS[KeyRole.COMMAND_SIGNER])
    registry = PolicyRegistry(VERIFIER)
    record = registry.install(engine_key.sign(_spec()))
    assert record.decision is DecisionKind.POLICY_REJECTED
    assert "command-signer key; a PolicySpec needs" in record.detail
    deletion = engine_key.sign(PolicyDeletion(deletes="p", up_to_version=1))
    assert "command-signer key" in registry.delete(deletion).detail


def test_pools_take_a_pool_publisher_key_confined_or_not() -> None:
    from dsec.policy_engine.pool_registry import PoolRegistry
    from dsec.schemas import PoolDeletion, PoolSpec
    from dsec.schemas.signing import TrustListVerifier, new_keyring

    pools = PoolRegistry(VERIFIER)
    assert pools.install(KEYRING.sign(PoolSpec(name="B"))).decision == "pool_accepted"
    policy_key = Ed25519Signer(PRIVATE_KEYS[KeyRole.POLICY_PUBLISHER])
    refused = pools.install(policy_key.sign(PoolSpec(name="C")))
    assert "policy-publisher key; a PoolSpec needs a pool-publisher key" in refused.detail
    team, trust, _ = new_keyring((KeyRole.POOL_PUBLISHER,), expires_at_ms=EXPIRES_AT_MS,
                                 pools=("a100",))
    confined = PoolRegistry(TrustListVerifier(trust))
    assert confined.install(team.sign(PoolSpec(name="a100"))).decision == "pool_accepted"
    other = confined.install(team.sign(PoolSpec(name="h100")))
    assert "publishes pools ['a100'] only, not h100" in other.detail
    stop = confined.delete(team.sign(PoolDeletion(deletes="h100", up_to_version=9)))
    assert stop is not None and "not h100" in stop.detail
    assert confined.delete(team.sign(PoolDeletion(deletes="a100", up_to_version=1))).decision \
        == "pool_deleted"


def test_every_action_parameter_is_bounded() -> None:
    with pytest.raises(PolicyRejected, match="less than or equal"):
        parse_policy("name: p\ncondition: 'x > 1.0'\n"
                     "action: {params: {kind: grad_accumulation, steps: 1000}}\n")
    with pytest.raises(PolicyRejected, match="out of bounds"):
        parse_policy(json.dumps({
            "name": "p", "condition": "x > 1.0", "params": {"cap": 1.0},
            "stages": [{"actions": [{"kind": "memory_cap", "limit_bytes": GIB}],
                        "bind": {"memory_cap.limit_bytes": "cap"}}]}))
    with pytest.raises(PolicyRejected, match="exactly one"):
        parse_policy("name: p\ncondition: 'x > 1.0'\n")
    with pytest.raises(PolicyRejected, match="a mapping"):
        parse_policy("- just a list")
    registry = PolicyRegistry(VERIFIER)
    shadow = KEYRING.sign(_spec(params={"worker_lost": 1.0}))
    assert "shadow" in registry.install(shadow).detail


def test_builtin_pack_is_trusted_as_installed_and_overridable() -> None:
    pack = load_builtin_policies({"bandwidth-latency-breaker": {"latency_cap_ms": 70}})
    registry = PolicyRegistry(VERIFIER)
    assert all(p.signature is None for p in pack)
    assert all(registry.install(p).decision is DecisionKind.POLICY_REJECTED for p in pack)
    assert all(registry.install_trusted(p).decision is DecisionKind.POLICY_ACCEPTED
               for p in pack)
    assert registry.get("bandwidth-latency-breaker").params["latency_cap_ms"] == 70
    with pytest.raises(PolicyRejected, match="no parameters"):
        load_builtin_policies({"bandwidth-latency-breaker": {"nope": 1}})


def test_builtin_pack_in_dry_run_is_shadowed() -> None:
    pack = load_builtin_policies(dry_run=True)
    registry = PolicyRegistry(VERIFIER)
    assert all(p.dry_run for p in pack)
    assert all("dry-run" in registry.install_trusted(p).detail for p in pack)


def test_policy_json_schema_for_editors_is_current() -> None:
    shipped = Path(__file__).parents[2] / "policy_engine" / "policy.schema.json"
    assert json.loads(shipped.read_text()) == PolicySpec.model_json_schema()


def test_cli_tests_a_policy_offline_against_a_trace(tmp_path: Path) -> None:
    from feature_values import STUCK
    from test_policy_engine import HEALTHY, trace

    from dsec.cli import app

    trace_path = tmp_path / "trace.jsonl"
    events = trace({**HEALTHY, **STUCK}, 20, worker="7")
    trace_path.write_bytes(b"\n".join(encode(e) for e in events))
    policy = Path(__file__).parents[2] / "policy_engine" / "builtin" / "stuck-episode.yaml"
    result = CliRunner().invoke(app, ["policy", "test", str(policy), "--trace",
                                      str(trace_path), "--json"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [r["decision"] for r in rows] == ["fired", "fired"]
    assert {r["action"]["kind"] for r in rows} == {"memory_cap", "sync_priority"}
    assert "Agent_7_episode_stuck_collision_3x" in rows[0]["detail"]
