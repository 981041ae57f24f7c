"""The fleet level on the real broker and ClickHouse engine (``dsec up``: stream jobs, policy
engine, sink): meta-policies fed fleet feature events tune one pool within their floors,
a slow recovery makes the next snapshot of a real worker in the pool be written at the
raised level, and a canary reaches its pool alone until promoted or rolled back, every
step audited in ClickHouse.

Fleet feature events are sent by hand here (the fleet features job makes them in
production); time is compressed by dating them over the hours the policies wait for.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import pytest
import torch
from feature_values import HEALTHY
from helpers import wait_for
from policy_broker import Reader, Rig, env_for, trace

import dsec
from dsec.actuators.snapshot_store import list_sequences, read_manifest
from dsec.history import query
from dsec.ingest import ProbeConfig
from dsec.schemas import FeatureEvent, PoolSpec, now_ms
from dsec.schemas.features import fleet_identity

pytestmark = pytest.mark.integration
GIB = 1 << 30
HOUR_MS = 3_600_000


@pytest.fixture(scope="module")
def rig(running_stack):
    rig = Rig(running_stack)
    rig.pools = Reader(running_stack, rig.topics.pools, None)
    try:
        yield rig
    finally:
        rig.pools.close()
        rig.close()


def _rows(settings, sql: str) -> list:
    return query(settings, sql)["rows"]


def _dsec(settings, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "dsec.cli", *args], env=env_for(settings),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _fleet(pool: str, features: dict, start_ms: int, hours: float,
           step_s: int = 600) -> list[FeatureEvent]:
    return [FeatureEvent(identity=fleet_identity("test-job", pool), scope="pool", window="1h",
                         features=features, tags={"pool": pool},
                         event_time_ms=start_ms + t * 1000)
            for t in range(0, int(hours * 3600), step_s)]


def _pool_versions(rig, name: str) -> list[PoolSpec]:
    return [PoolSpec.model_validate_json(value) for key, value in rig.pools.drain(0.5)
            if key == name.encode() and value]


def test_breaker_trips_in_pool_a_tune_pool_a_alone_and_the_change_is_undone(rig) -> None:
    settings = rig.settings
    start = now_ms() - 2 * HOUR_MS
    # 4 trips in the last hour on A, 3 on B (the meta-policy wants more than 3)
    rig.send(_fleet("brk-A", {"breaker_trips_per_hour": 4.0}, start, 1)
             + _fleet("brk-B", {"breaker_trips_per_hour": 3.0}, start, 1))
    accepted = wait_for(lambda: _rows(
        settings, "SELECT policy_version, detail FROM policy_decisions "
                  "WHERE policy_name = 'pool:brk-A' AND decision = 'pool_accepted'"),
        120, what="pool brk-A's tuned version in ClickHouse")
    assert accepted[0][0] == 1 and "meta-breaker-trips v1" in accepted[0][1]
    (tuned,) = wait_for(lambda: _pool_versions(rig, "brk-A"), 30, what="the pools record")
    assert tuned.quotas.latency_cap_ms == 75 and tuned.signature
    fired = _rows(settings, "SELECT worker_id, detail FROM policy_decisions WHERE "
                            "policy_name = 'meta-breaker-trips' AND decision = 'fired'")
    assert [row[0] for row in fired] == ["pool:brk-A"]
    assert "bandwidth-latency-breaker.latency_cap_ms 85 -> 75" in fired[0][1]
    assert not _pool_versions(rig, "brk-B")

    # the tuned cap acts on pool A's workers, not on pool B's
    over = {**HEALTHY, "grad_sync_latency_p95_ms": 80.0}
    recent = now_ms() - 60_000
    rig.send(trace(over, 20, "brk-a1", recent, tags={"pool": "brk-A"})
             + trace(over, 20, "brk-b1", recent, tags={"pool": "brk-B"}))
    commands = wait_for(lambda: _rows(
        settings, "SELECT worker_id, reason FROM actuations "
                  "WHERE policy_name = 'bandwidth-latency-breaker'"),
        60, what="the breaker's command")
    assert {row[0] for row in commands} == {"brk-a1"}
    assert "(pool brk-A v1)" in commands[0][1]

    status = json.loads(_dsec(settings, "policy", "status", "bandwidth-latency-breaker",
                              "--json"))
    where = {row["where"]: row for row in status["running"]}
    assert where["pool brk-A"]["overrides"] == {"latency_cap_ms": 75.0}
    assert "pool brk-B" not in where
    _dsec(settings, "policy", "revert", "bandwidth-latency-breaker", "--pool", "brk-A")
    reverted = wait_for(lambda: _rows(
        settings, "SELECT detail FROM policy_decisions WHERE policy_name = 'pool:brk-A' "
                  "AND decision = 'pool_accepted' AND policy_version = 2"),
        60, what="the revert, audited")
    assert "revert of bandwidth-latency-breaker to pool brk-A v0" in reverted[0][0]
    history = json.loads(_dsec(settings, "policy", "history", "bandwidth-latency-breaker",
                               "--json"))["history"]
    assert [(e["scope"], e["version"], e["params"]) for e in history
            if e["scope"] == "pool brk-A"] == [("pool brk-A", 1, {"latency_cap_ms": 75.0}),
                                               ("pool brk-A", 2, {})]


def test_low_utilisation_shrinks_the_quota_to_its_floor_and_no_further(rig) -> None:
    settings = rig.settings
    # 30 hours under 40 %: from 7 GiB, 512 MiB every 2 h would reach 0 after 28 h
    rig.send(_fleet("util-A", {"pool_utilisation_rate": 0.25}, now_ms() - 31 * HOUR_MS, 30))
    wait_for(lambda: _rows(
        settings, "SELECT count() FROM policy_decisions WHERE policy_name = "
                  "'meta-pool-utilisation' AND worker_id = 'pool:util-A' AND detail LIKE "
                  "'%already at its bound%'")[0][0] >= 3, 120, what="the quota at its floor")
    quotas = [p.quotas.base_memory_bytes for p in _pool_versions(rig, "util-A")]
    assert quotas == [int((7 - 0.5 * n) * GIB) for n in range(1, 7)]
    assert min(quotas) == 4 * GIB  # elastic-memory-quota's declared floor


def test_slow_recovery_raises_compression_and_the_next_snapshot_is_written_at_it(
    rig, tmp_path
) -> None:
    settings = rig.settings
    rig.send(_fleet("snap-A", {"snapshot_recovery_time_s": 12.0}, now_ms() - HOUR_MS, 0.5))
    wait_for(lambda: _rows(settings, "SELECT count() FROM policy_decisions WHERE "
                                     "policy_name = 'pool:snap-A'")[0][0], 120,
             what="pool snap-A's tuned version")
    (pool,) = _pool_versions(rig, "snap-A")
    assert pool.params == {"periodic-snapshot": {"compression_level": 6.0}}

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    worker_id = f"snap-{uuid.uuid4().hex[:6]}"
    dsec.init(worker_id=worker_id, node_id="node-s", pool="snap-A", optimizer=optimizer,
              settings=settings, probe_config=ProbeConfig(heartbeat_interval_s=1.0))
    snapshotter = dsec.enable_snapshots(model, optimizer, directory=str(tmp_path / "snaps"))
    try:
        deadline = time.monotonic() + 90
        while snapshotter.stats.taken == 0 and time.monotonic() < deadline:
            x = torch.randn(32, 16)
            loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            time.sleep(0.02)
        snapshotter.wait_idle(30)
    finally:
        dsec.shutdown()
    (first, *_) = list_sequences(tmp_path / "snaps")
    assert read_manifest(tmp_path / "snaps", first).meta["compression_level"] == 6
    commands = _rows(settings, "SELECT params, reason FROM actuations WHERE worker_id = "
                               f"'{worker_id}' AND policy_name = 'periodic-snapshot'")
    assert json.loads(commands[0][0])["compression_level"] == 6
    assert "(pool snap-A v1)" in commands[0][1]


def _policy_file(tmp_path, version: int, threshold: float) -> str:
    path = tmp_path / f"custom-v{version}.yaml"
    path.write_text(f"name: custom-canary\nversion: {version}\n"
                    f"condition: gpu_temperature_c > {threshold}\ncooldown_s: 600\n"
                    "action: {params: {kind: snapshot}}\n")
    return str(path)


def test_a_canary_reaches_its_pool_alone_then_is_promoted_and_a_later_one_rolled_back(
    rig, tmp_path
) -> None:
    settings = rig.settings
    hot = {"gpu_temperature_c": 95.0}

    def commanded(workers: list[str]) -> dict:
        names = ", ".join(f"'{w}'" for w in workers)
        rows = _rows(settings, "SELECT worker_id, policy_version FROM actuations WHERE "
                               f"policy_name = 'custom-canary' AND worker_id IN ({names})")
        return dict(rows) if len(rows) == len(workers) else {}

    def audited(decision: str, version: int) -> str:
        return wait_for(lambda: _rows(
            settings, "SELECT detail FROM policy_decisions WHERE policy_name = "
                      f"'custom-canary' AND decision = '{decision}' AND policy_version = "
                      f"{version}"), 60, what=f"{decision} v{version} in ClickHouse")[0][0]

    _dsec(settings, "policy", "publish", _policy_file(tmp_path, 1, 90.0))
    _dsec(settings, "policy", "publish", _policy_file(tmp_path, 2, 80.0),
          "--canary-pool", "can-A")
    assert "as a canary in pool can-A, in place of v1" in audited("policy_accepted", 2)
    rig.send(trace(hot, 5, "can-a1", now_ms(), tags={"pool": "can-A"})
             + trace(hot, 5, "can-b1", now_ms(), tags={"pool": "can-B"}))
    assert wait_for(lambda: commanded(["can-a1", "can-b1"]), 60,
                    what="both workers' commands") == {"can-a1": 2, "can-b1": 1}
    status = json.loads(_dsec(settings, "policy", "status", "custom-canary", "--json"))
    assert [(r["where"], r["version"]) for r in status["running"]] == [("fleet", 1),
                                                                      ("pool can-A", 2)]

    _dsec(settings, "policy", "promote", "custom-canary")
    assert "removed after its promotion" in audited("policy_deleted", 2)
    assert "promoted from the canary in pool can-A" in wait_for(lambda: [
        row for row in _rows(settings, "SELECT detail FROM policy_decisions WHERE policy_name"
                                       " = 'custom-canary' AND decision = 'policy_accepted' "
                                       "AND policy_version = 2") if "promoted" in row[0]],
        60, what="the promotion, audited")[0][0]
    rig.send(trace(hot, 5, "can-b2", now_ms(), tags={"pool": "can-B"}))
    assert wait_for(lambda: commanded(["can-b2"]), 60, what="pool B on v2") == {"can-b2": 2}

    _dsec(settings, "policy", "publish", _policy_file(tmp_path, 3, 70.0),
          "--canary-pool", "can-A")
    audited("policy_accepted", 3)
    _dsec(settings, "policy", "rollback", "custom-canary")
    assert "rolled back: pool can-A runs v2" in audited("policy_deleted", 3)
    rig.send(trace(hot, 5, "can-a2", now_ms(), tags={"pool": "can-A"}))
    assert wait_for(lambda: commanded(["can-a2"]), 60, what="pool A back on v2") == {
        "can-a2": 2}
