"""What runs where and every change, from the records of the policies and pools topics:
status, history, and the records that promote, roll back and revert."""

from __future__ import annotations

import pytest
from keys import KEYRING, VERIFIER

from dsec.policy_engine.builtin import load_builtin_policies
from dsec.policy_engine.policy_log import PolicyRecord
from dsec.policy_engine.rollout import RolloutError, Rollouts
from dsec.schemas import PolicyDeletion, PolicySpec, PoolSpec, encode
from dsec.schemas.policies import policy_key
from dsec.schemas.pools import PoolQuotas

BREAKER = "bandwidth-latency-breaker"
# versions are counted from the built-in pack's own
V = {p.name: p for p in load_builtin_policies()}[BREAKER].version


def _records(*items) -> list[PolicyRecord]:
    out = []
    for offset, item in enumerate(items):
        signed = KEYRING.sign(item)
        if isinstance(item, PoolSpec):
            key = item.name
        elif isinstance(item, PolicyDeletion):
            key = policy_key(item.deletes, item.pool)
        else:
            key = policy_key(item.name, item.pool)
        out.append(PolicyRecord(key.encode(), encode(signed), offset))
    return out


def _view(policies=(), pools=()) -> Rollouts:
    return Rollouts(VERIFIER, load_builtin_policies(), _records(*policies), _records(*pools))


def _breaker(version: int, **changes) -> PolicySpec:
    body = {p.name: p for p in load_builtin_policies()}[BREAKER].model_dump(
        mode="json", exclude_none=True)
    return PolicySpec.model_validate({**body, "version": version, **changes})


def test_status_shows_the_fleet_version_canaries_and_pool_overrides() -> None:
    view = _view([_breaker(V + 1, pool="A")],
                 [PoolSpec(name="B", quotas=PoolQuotas(latency_cap_ms=75), reason="tuned"),
                  PoolSpec(name="C"), PoolSpec(name="D", dry_run=True)])
    rows = {row.where: row for row in view.status(BREAKER)}
    assert set(rows) == {"fleet", "pool A", "pool B", "pool D"}
    assert (rows["fleet"].version, rows["fleet"].how) == (V, "built-in")
    assert (rows["pool A"].version, rows["pool A"].how) == (V + 1, "canary")
    assert rows["pool B"].overrides == {"latency_cap_ms": 75} and rows["pool B"].version == V
    assert rows["pool D"].dry_run
    with pytest.raises(RolloutError, match="no policy nope"):
        view.status("nope")


def test_promote_publishes_the_canary_as_the_fleets_then_removes_it() -> None:
    view = _view([_breaker(V + 1, pool="A", dry_run=True)])
    fleet, removal = view.promote(BREAKER)
    assert (fleet.version, fleet.pool, fleet.dry_run) == (V + 1, None, False)
    assert (removal.deletes, removal.pool, removal.up_to_version) == (BREAKER, "A", V + 1)
    after = _view([_breaker(V + 1, pool="A", dry_run=True), fleet, removal])
    assert [(r.where, r.version) for r in after.status(BREAKER)] == [("fleet", V + 1)]
    with pytest.raises(RolloutError, match="no pool"):
        after.promote(BREAKER)


def test_rollback_removes_the_canaries() -> None:
    view = _view([_breaker(V + 1, pool="A"), _breaker(V + 2, pool="B")])
    with pytest.raises(RolloutError, match="name the pool"):
        view.promote(BREAKER)
    rolled_back = [(r.pool, r.up_to_version) for r in view.rollback(BREAKER)]
    assert rolled_back == [("A", V + 1), ("B", V + 2)]
    assert [r.pool for r in view.rollback(BREAKER, "B")] == ["B"]
    with pytest.raises(RolloutError, match="no canary running in pool C"):
        view.rollback(BREAKER, "C")


def test_history_and_revert_of_fleet_versions() -> None:
    view = _view([_breaker(V + 1, params={**_breaker(V).params, "latency_cap_ms": 75})])
    history = view.history(BREAKER)
    assert [(e.scope, e.version, e.params["latency_cap_ms"]) for e in history] == [
        ("fleet", V, 85), ("fleet", V + 1, 75)]
    reverted = view.revert(BREAKER)
    assert (reverted.version, reverted.params["latency_cap_ms"]) == (V + 2, 85)
    assert view.revert(BREAKER, to=V + 1).params["latency_cap_ms"] == 75
    with pytest.raises(RolloutError, match="no version 9"):
        view.revert(BREAKER, to=9)
    with pytest.raises(RolloutError, match="no earlier fleet version"):
        _view().revert(BREAKER)


def test_history_and_revert_of_a_pools_tuned_overrides() -> None:
    declared = PoolSpec(name="A", quotas=PoolQuotas(base_memory_bytes=6 << 30),
                        params={"stuck-episode": {"streak": 5}})
    tuned = declared.with_override(BREAKER, "latency_cap_ms", 75, 2, "meta-breaker-trips v1")
    again = tuned.with_override(BREAKER, "latency_cap_ms", 65, 3, "meta-breaker-trips v1")
    view = _view(pools=[declared, tuned, again])
    pool_rows = [(e.scope, e.version, e.params) for e in view.history(BREAKER)
                 if e.scope.startswith("pool")]
    assert pool_rows == [("pool A", 2, {"latency_cap_ms": 75}),
                         ("pool A", 3, {"latency_cap_ms": 65})]
    undo = view.revert_pool(BREAKER, "A")
    assert (undo.version, undo.quotas.latency_cap_ms) == (4, 75)
    assert undo.quotas.base_memory_bytes == 6 << 30 and undo.params == declared.params
    assert "revert of bandwidth-latency-breaker to pool A v2" in undo.reason
    untuned = view.revert_pool(BREAKER, "A", to=1)
    assert untuned.quotas.latency_cap_ms is None and untuned.quotas.base_memory_bytes
    with pytest.raises(RolloutError, match="never changed"):
        view.revert_pool("periodic-snapshot", "A")
    with pytest.raises(RolloutError, match="no pool Z"):
        view.revert_pool(BREAKER, "Z")
