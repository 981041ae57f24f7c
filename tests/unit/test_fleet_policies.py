"""Meta-policies on fleet feature events tune one pool, within the floors and ceilings of
the parameters; canary versions run in their pool alone, beside or instead of the fleet's."""

from __future__ import annotations

from feature_values import GIB, HEALTHY, STUCK
from keys import KEYRING, VERIFIER
from test_policy_engine import trace

from dsec.policy_engine.builtin import load_builtin_policies
from dsec.policy_engine.registry import PolicyRegistry
from dsec.policy_engine.trace import replay
from dsec.schemas import FeatureEvent, PolicyDeletion, PolicySpec, PoolSpec
from dsec.schemas.features import fleet_identity
from dsec.schemas.policies import DecisionKind

PACK = {p.name: p for p in load_builtin_policies()}
# The canaries below are versions 2 and 3 of a fleet version 1.
PACK["stuck-episode"] = PACK["stuck-episode"].model_copy(update={"version": 1})
HOUR_MS = 3_600_000


def fleet(pool: str, features: dict, hours: float, step_s: int = 600,
          start_ms: int = 1_000_000) -> list[FeatureEvent]:
    """Fleet feature events of ``pool``, one every ``step_s`` for ``hours``."""
    return [FeatureEvent(identity=fleet_identity("job", pool), scope="pool", window="1h",
                         features=features, tags={"pool": pool},
                         event_time_ms=start_ms + t * 1000)
            for t in range(0, int(hours * 3600), step_s)]


def test_breaker_trips_in_one_pool_tune_that_pools_latency_cap_alone() -> None:
    events = (fleet("A", {"breaker_trips_per_hour": 4.0}, 0.5)
              + fleet("B", {"breaker_trips_per_hour": 3.0}, 0.5))
    result = replay([PACK["meta-breaker-trips"], PACK["bandwidth-latency-breaker"]], events)
    (pool,) = result.output.pools
    assert (pool.name, pool.version, pool.quotas.latency_cap_ms) == ("A", 1, 75)
    assert pool.signature and "meta-breaker-trips v1" in pool.reason
    assert not result.output.policies  # the breaker's own version is untouched
    fired = [d for d in result.output.decisions if d.decision is DecisionKind.FIRED]
    assert [d.detail.split(";")[0] for d in fired] == [
        "published pool A v1: bandwidth-latency-breaker.latency_cap_ms 85 -> 75"]
    assert [d.decision for d in result.output.decisions
            if d.policy_name == "pool:A"] == [DecisionKind.POOL_ACCEPTED]


def test_the_tuned_cap_reaches_the_pools_workers_and_no_others() -> None:
    over = {**HEALTHY, "grad_sync_latency_p95_ms": 80.0}  # over 75, under 85
    events = (fleet("A", {"breaker_trips_per_hour": 5.0}, 0.1)
              + trace(over, 30, worker="a1", tags={"pool": "A"}, start_ms=2_000_000)
              + trace(over, 30, worker="b1", tags={"pool": "B"}, start_ms=2_000_000))
    result = replay([PACK["meta-breaker-trips"], PACK["bandwidth-latency-breaker"]], events)
    assert {c.target.worker_id for c in result.output.commands} == {"a1"}


def test_pool_utilisation_low_for_hours_shrinks_the_quota_down_to_its_floor_only() -> None:
    # 40 hours under 40 %: a step every 2 h from 7 GiB would go far below 4 GiB.
    events = fleet("A", {"pool_utilisation_rate": 0.2}, 40)
    result = replay([PACK["meta-pool-utilisation"], PACK["elastic-memory-quota"]], events)
    quotas = [p.quotas.base_memory_bytes for p in result.output.pools]
    assert quotas == [int((7 - 0.5 * n) * GIB) for n in range(1, 7)]  # 6.5 .. 4 GiB
    assert min(quotas) == 4 * GIB
    at_floor = [d for d in result.output.decisions if "already at its bound" in d.detail]
    assert at_floor and all(d.decision is DecisionKind.FIRED for d in at_floor)
    short = replay([PACK["meta-pool-utilisation"], PACK["elastic-memory-quota"]],
                   fleet("A", {"pool_utilisation_rate": 0.2}, 1.9))
    assert not short.output.pools  # for: 2 h


def test_slow_recovery_raises_the_pools_snapshot_compression_in_its_commands() -> None:
    live = {**HEALTHY, "heartbeat_age_s": 1.0}
    events = (fleet("A", {"snapshot_recovery_time_s": 12.0}, 0.1)
              + trace(live, 5, worker="a1", tags={"pool": "A"}, start_ms=2_000_000)
              + trace(live, 5, worker="b1", tags={"pool": "B"}, start_ms=2_000_000))
    result = replay([PACK["meta-snapshot-recovery"], PACK["periodic-snapshot"]], events)
    assert [p.params for p in result.output.pools] == [{"periodic-snapshot":
                                                        {"compression_level": 6.0}}]
    levels = {c.target.worker_id: c.action.compression_level for c in result.output.commands}
    assert levels == {"a1": 6, "b1": 3}


def test_a_tuned_parameter_without_a_floor_and_ceiling_is_not_tuned() -> None:
    unbounded = PACK["bandwidth-latency-breaker"].model_copy(update={"bounds": {}})
    result = replay([PACK["meta-breaker-trips"], unbounded],
                    fleet("A", {"breaker_trips_per_hour": 5.0}, 0.1))
    assert not result.output.pools
    assert "declares no floor and ceiling" in result.output.decisions[0].detail


def test_fleet_events_command_no_worker() -> None:
    everything = {**HEALTHY, "grad_sync_latency_p95_ms": 500.0, "worker_lost": 1.0}
    result = replay(list(PACK.values()), fleet("A", everything, 0.5))
    assert not result.output.commands


def _canary(base: PolicySpec, pool: str, version: int, **changes) -> PolicySpec:
    body = base.model_dump(mode="json", exclude_none=True)
    return PolicySpec.model_validate({**body, "pool": pool, "version": version, **changes})


def test_a_canary_runs_in_its_pool_alone_and_its_commands_carry_its_version() -> None:
    stuck = PACK["stuck-episode"]
    canary = _canary(stuck, "A", 2, params={**stuck.params, "stuck_cap_bytes": 2 * GIB})
    features = {**HEALTHY, **STUCK}
    events = (trace(features, 10, worker="a1", tags={"pool": "A"})
              + trace(features, 10, worker="b1", tags={"pool": "B"})
              + trace(features, 10, worker="n1"))
    result = replay([stuck, canary], events)
    versions = {(c.target.worker_id, c.policy_version, getattr(c.action, "limit_bytes", None))
                for c in result.output.commands if c.action.kind == "memory_cap"}
    assert versions == {("a1", 2, 2 * GIB), ("b1", 1, 4 * GIB), ("n1", 1, 4 * GIB)}


def test_a_dry_run_canary_is_audited_beside_the_version_that_acts() -> None:
    stuck = PACK["stuck-episode"]
    shadow = _canary(stuck, "A", 2, dry_run=True)
    features = {**HEALTHY, **STUCK}
    result = replay([stuck, shadow], trace(features, 10, worker="a1", tags={"pool": "A"}))
    assert {c.policy_version for c in result.output.commands} == {1}
    assert {(d.policy_version, d.decision) for d in result.output.decisions} == {
        (1, DecisionKind.FIRED), (2, DecisionKind.DRY_RUN)}


def test_promote_and_rollback_of_a_canary_in_the_registry() -> None:
    registry = PolicyRegistry(VERIFIER)
    stuck = PACK["stuck-episode"]
    registry.install(KEYRING.sign(stuck))
    accepted = registry.install(KEYRING.sign(_canary(stuck, "A", 2)))
    assert "as a canary in pool A, in place of v1" in accepted.detail
    assert registry.get("stuck-episode", "A").version == 2
    assert registry.get("stuck-episode", "B").version == 1
    assert registry.latest_version("stuck-episode") == 2
    stale = registry.install(KEYRING.sign(_canary(stuck, "B", 1)))
    assert "not newer than v1, the fleet's" in stale.detail
    # rollback: a signed deletion of the pool's version; the pool runs the fleet's again
    rolled = registry.delete(KEYRING.sign(PolicyDeletion(deletes="stuck-episode", pool="A",
                                                 up_to_version=2)))
    assert rolled.decision is DecisionKind.POLICY_DELETED and "pool A runs v1" in rolled.detail
    assert registry.get("stuck-episode", "A").version == 1
    assert "deleted up to v2" in registry.install(KEYRING.sign(_canary(stuck, "A", 2))).detail
    # promote: the canary's body as the fleet's version; the canary no longer runs
    registry.install(KEYRING.sign(_canary(stuck, "A", 3)))
    promoted = registry.install(KEYRING.sign(stuck.model_copy(update={"version": 3})))
    assert "promoted from the canary in pool A" in promoted.detail
    assert registry.canaries("stuck-episode") == {}
    assert registry.get("stuck-episode", "A").pool is None


def test_canary_records_are_keyed_by_policy_and_pool() -> None:
    from dsec.schemas import encode

    registry = PolicyRegistry(VERIFIER)
    canary = KEYRING.sign(_canary(PACK["stuck-episode"], "A", 2))
    assert "keyed 'stuck-episode'" in registry.offer(b"stuck-episode", encode(canary)).detail
    assert registry.offer(b"stuck-episode@A", encode(canary)).decision == "policy_accepted"
    deletion = KEYRING.sign(PolicyDeletion(deletes="stuck-episode", pool="A", up_to_version=2))
    assert registry.offer(b"stuck-episode", encode(deletion)).decision == "policy_rejected"
    assert registry.offer(b"stuck-episode@A", encode(deletion)).decision == "policy_deleted"


def test_a_pool_canary_and_pool_overrides_combine() -> None:
    stuck = PACK["stuck-episode"]
    canary = _canary(stuck, "A", 2, priority=210)
    pool = PoolSpec(name="A", params={"stuck-episode": {"stuck_cap_bytes": 3 * GIB}})
    result = replay([stuck, canary], trace({**HEALTHY, **STUCK}, 10,
                                           worker="a1", tags={"pool": "A"}), pools=[pool])
    caps = [(c.policy_version, c.action.limit_bytes) for c in result.output.commands
            if c.action.kind == "memory_cap"]
    assert caps == [(2, 3 * GIB)]
