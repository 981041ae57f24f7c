"""Resource pools as data: the schema, the registry of the pools topic, and what a policy
becomes for a pool's workers (its overrides on top, in dry run where the pool is)."""

from __future__ import annotations

import pytest
from feature_values import GIB, HEALTHY
from keys import KEYRING, VERIFIER
from test_policy_engine import trace

from dsec.policy_engine.builtin import load_builtin_policies
from dsec.policy_engine.pool_registry import PoolRegistry, parse_pool
from dsec.policy_engine.trace import replay
from dsec.schemas import PoolDeletion, PoolSpec, encode
from dsec.schemas.policies import DecisionKind
from dsec.schemas.pools import PoolQuotas

PACK = {p.name: p for p in load_builtin_policies()}


def test_a_pool_in_yaml_with_quotas_labels_and_overrides() -> None:
    pool = parse_pool("""
name: a100-pool
labels: {gpu_model: NVIDIA A100, node_group: ng-a}
quotas: {base_memory_bytes: 6442450944, elastic_memory_bytes: 10737418240,
         latency_cap_ms: 60}
params:
  stuck-episode: {streak: 5}
""")
    assert pool.overrides("elastic-memory-quota") == {"base_quota_bytes": 6 * GIB,
                                                      "ceiling_bytes": 10 * GIB}
    assert pool.overrides("bandwidth-latency-breaker") == {"latency_cap_ms": 60}
    assert pool.overrides("stuck-episode") == {"streak": 5}
    tuned = pool.with_override("bandwidth-latency-breaker", "latency_cap_ms", 50, 2, "why")
    assert (tuned.version, tuned.quotas.latency_cap_ms, tuned.reason) == (2, 50, "why")
    other = pool.with_override("stuck-episode", "streak", 4, 3, "")
    assert other.params == {"stuck-episode": {"streak": 4}}


@pytest.mark.parametrize(("body", "fragment"), [
    ({"quotas": {"base_memory_bytes": 13 * GIB, "elastic_memory_bytes": 12 * GIB}},
     "must not exceed"),
    ({"params": {"bandwidth-latency-breaker": {"latency_cap_ms": 50}}}, "quotas.latency_cap_ms"),
    ({"quotas": {"latency_cap_ms": 0}}, "greater than 0"),
    ({"labels": {"Bad Key": "x"}}, "labels"),
])
def test_a_pool_that_does_not_hold_together_is_refused(body: dict, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        PoolSpec.model_validate({"name": "p", **body})


def test_the_registry_keeps_signed_newer_versions_and_signed_deletions() -> None:
    pools = PoolRegistry(VERIFIER)
    first = KEYRING.sign(PoolSpec(name="A", quotas=PoolQuotas(latency_cap_ms=60)))
    assert pools.offer(b"A", encode(first)).decision is DecisionKind.POOL_ACCEPTED
    assert pools.offer(b"A", encode(first)) is None  # the same version again
    assert "signature" in pools.install(PoolSpec(name="A", version=2)).detail
    assert "not newer" in pools.install(KEYRING.sign(PoolSpec(name="A", version=1,
                                                      dry_run=True))).detail
    assert "names 'A'" in pools.offer(b"B", encode(first)).detail
    assert pools.offer(b"A", None).decision is DecisionKind.POOL_REJECTED
    assert pools.offer(b"A", b"{not yaml").decision is DecisionKind.POOL_REJECTED
    assert pools.get("A") == first and pools.next_version("A") == 2
    deleted = pools.offer(b"A", encode(KEYRING.sign(PoolDeletion(deletes="A", up_to_version=1))))
    assert deleted.decision is DecisionKind.POOL_DELETED and pools.get("A") is None
    assert pools.install(first) is None and pools.get("A") is None  # a replay: no news
    refused = KEYRING.sign(PoolSpec(name="A", version=1, description="again"))
    assert decided(pools.install(refused)) == DecisionKind.POOL_REJECTED
    assert pools.next_version("A") == 2
    assert decided(pools.install(KEYRING.sign(PoolSpec(name="A", version=2)))) == "pool_accepted"


def decided(decision) -> str | None:
    return None if decision is None else decision.decision


def test_a_policy_for_a_pools_workers_carries_the_pools_overrides() -> None:
    pools = PoolRegistry(VERIFIER)
    pools.install(KEYRING.sign(PoolSpec(name="A", quotas=PoolQuotas(latency_cap_ms=60))))
    pools.install(KEYRING.sign(PoolSpec(name="shadow", dry_run=True)))
    pools.install(KEYRING.sign(PoolSpec(name="low", quotas=PoolQuotas(latency_cap_ms=5))))
    pools.install(KEYRING.sign(PoolSpec(name="odd", params={"bandwidth-latency-breaker":
                                                    {"nope": 1.0}})))
    breaker = PACK["bandwidth-latency-breaker"]
    assert pools.effective(breaker, None).spec is breaker
    assert pools.effective(breaker, "unknown").spec is breaker
    in_a = pools.effective(breaker, "A")
    assert in_a.spec.params["latency_cap_ms"] == 60 and in_a.note == "pool A v1"
    assert pools.effective(breaker, "shadow").spec.dry_run
    below_floor = pools.effective(breaker, "low")  # a floor no pool goes under
    assert below_floor.spec is breaker and "outside its bounds" in below_floor.problem
    assert "has not: nope" in pools.effective(breaker, "odd").problem


def test_every_policy_honours_its_pools_overrides_and_dry_run() -> None:
    pools = [PoolSpec(name="tight", quotas=PoolQuotas(latency_cap_ms=50,
                                                      base_memory_bytes=5 * GIB)),
             PoolSpec(name="watch", dry_run=True)]
    features = {**HEALTHY, "grad_sync_latency_p95_ms": 60.0,
                "gpu_process_memory_bytes": 13 * GIB}
    events = (trace(features, 30, worker="in-tight", tags={"pool": "tight"})
              + trace(features, 30, worker="in-none")
              + trace({**features, "grad_sync_latency_p95_ms": 120.0}, 30, worker="in-watch",
                      tags={"pool": "watch"}))
    result = replay([PACK["bandwidth-latency-breaker"], PACK["elastic-memory-quota"]], events,
                    pools=pools)
    by_worker: dict[str, list] = {}
    for command in result.output.commands:
        by_worker.setdefault(command.target.worker_id, []).append(command)
    breaker = [c for c in by_worker["in-tight"] if c.policy_name == "bandwidth-latency-breaker"]
    assert breaker and "(pool tight v1)" in breaker[0].reason
    caps = [c.action.limit_bytes for c in by_worker["in-tight"] if c.action.kind == "memory_cap"]
    assert caps == [5 * GIB]
    assert [c.action.limit_bytes for c in by_worker["in-none"]
            if c.action.kind == "memory_cap"] == [7 * GIB]
    assert not [c for c in by_worker["in-none"] if c.policy_name == "bandwidth-latency-breaker"]
    assert "in-watch" not in by_worker
    assert {d.decision for d in result.output.decisions
            if d.identity and d.identity.worker_id == "in-watch"} == {DecisionKind.DRY_RUN}


def test_cli_validates_pool_files(tmp_path) -> None:
    from typer.testing import CliRunner

    from dsec.cli import app

    good = tmp_path / "a.yaml"
    good.write_text("name: a100-pool\nquotas: {latency_cap_ms: 60}\n")
    bad = tmp_path / "b.yaml"
    bad.write_text("name: b\nquotas: {latency_cap_ms: -1}\n")
    result = CliRunner().invoke(app, ["pool", "validate", str(good)])
    assert result.exit_code == 0 and "a100-pool v1 ok" in result.stdout
    result = CliRunner().invoke(app, ["pool", "validate", str(bad)])
    assert result.exit_code == 2 and "latency_cap_ms" in result.output


def test_a_version_read_back_behind_newer_ones_is_no_news() -> None:
    pools = PoolRegistry(VERIFIER)
    first, second = (KEYRING.sign(PoolSpec(name="A", version=v)) for v in (1, 2))
    pools.install(first)
    pools.install(second)
    assert pools.offer(b"A", encode(first)) is None
    assert pools.offer(b"A", encode(second)) is None
