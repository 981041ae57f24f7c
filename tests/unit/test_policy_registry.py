"""Policies checked before they run: shape, bounds, CEL, signature, version."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dsec.policy_engine.builtin import load_builtin_policies
from dsec.policy_engine.registry import PolicyRegistry, PolicyRejected, parse_policy
from dsec.schemas import PolicyDeletion, PolicySpec, encode, sign
from dsec.schemas.policies import DecisionKind

KEY = b"registry-test-key"
GIB = 1 << 30


def _spec(**changes: object) -> PolicySpec:
    base = {"name": "p", "condition": "gpu_temperature_c > 90.0",
            "action": {"params": {"kind": "snapshot"}}}
    return PolicySpec.model_validate({**base, **changes})


def test_accepts_signed_and_refuses_unsigned_or_tampered() -> None:
    registry = PolicyRegistry(KEY)
    assert registry.install(_spec()).decision is DecisionKind.POLICY_REJECTED
    signed = sign(_spec(), KEY)
    assert registry.install(signed).decision is DecisionKind.POLICY_ACCEPTED
    tampered = sign(_spec(version=2), KEY).model_copy(update={"condition": "true"})
    record = registry.install(tampered)
    assert record.decision is DecisionKind.POLICY_REJECTED
    assert "does not match" in record.detail
    assert registry.get("p").version == 1
    assert registry.install(sign(_spec(), b"another-key")).decision is (
        DecisionKind.POLICY_REJECTED)


def test_versions_only_move_forward_and_replays_are_quiet() -> None:
    registry = PolicyRegistry(KEY)
    registry.install(sign(_spec(version=2), KEY))
    assert registry.install(sign(_spec(version=2), KEY)) is None  # replayed record
    stale = registry.install(sign(_spec(version=1), KEY))
    assert stale.decision is DecisionKind.POLICY_REJECTED and "not newer" in stale.detail
    registry.install(sign(_spec(version=3, priority=7), KEY))
    assert registry.versions("p") == [2, 3] and registry.get("p").priority == 7


def test_topic_records_malformed_misnamed_and_deletions() -> None:
    registry = PolicyRegistry(KEY)
    assert registry.offer(b"x", b'{"name": ').decision is DecisionKind.POLICY_REJECTED
    misnamed = registry.offer(b"q", encode(sign(_spec(), KEY)))
    assert misnamed.decision is DecisionKind.POLICY_REJECTED and "named 'p'" in misnamed.detail
    bad_cel = sign(_spec(condition="gpu_temperature_c >"), KEY)
    assert registry.offer(b"p", encode(bad_cel)).decision is DecisionKind.POLICY_REJECTED
    assert registry.offer(b"p", encode(sign(_spec(), KEY))).decision is (
        DecisionKind.POLICY_ACCEPTED)
    deletion = encode(sign(PolicyDeletion(deletes="p", up_to_version=1), KEY))
    assert registry.offer(b"p", deletion).decision is DecisionKind.POLICY_DELETED
    assert registry.get("p") is None and registry.offer(b"p", deletion) is None


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
    registry = PolicyRegistry(KEY)
    shadow = sign(_spec(params={"worker_lost": 1.0}), KEY)
    assert "shadow" in registry.install(shadow).detail


def test_builtin_pack_is_signed_with_the_installation_key_and_overridable() -> None:
    pack = load_builtin_policies(KEY, {"bandwidth-latency-breaker": {"latency_cap_ms": 70}})
    registry = PolicyRegistry(KEY)
    assert all(registry.install(p).decision is DecisionKind.POLICY_ACCEPTED for p in pack)
    assert registry.get("bandwidth-latency-breaker").params["latency_cap_ms"] == 70
    with pytest.raises(PolicyRejected, match="no parameters"):
        load_builtin_policies(KEY, {"bandwidth-latency-breaker": {"nope": 1}})


def test_builtin_pack_in_dry_run_is_signed_and_shadowed() -> None:
    pack = load_builtin_policies(KEY, dry_run=True)
    registry = PolicyRegistry(KEY)
    assert all(p.dry_run for p in pack)
    assert all("dry-run" in registry.install(p).detail for p in pack)


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
