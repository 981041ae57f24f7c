"""Placement's tables on a chDB store: the sink's rows of each placement event go in, and
the history reader's queries read them back as the ranking needs them."""

from __future__ import annotations

import threading

import pytest

from dsec.infra.store.clickhouse import connect, ensure_schema
from dsec.infra.store.query_server import run_readonly
from dsec.infra.store.sink_batch import routes_for
from dsec.placement.history import read_history
from dsec.schemas import topic_names
from dsec.schemas.alerts import GpuHealthEvent
from dsec.schemas.placement import (
    GpuPersonalityEvent,
    GpuTopologyEvent,
    RegimeStats,
    WorkloadAffinityEvent,
)

T_MS = 1_800_000_000_000


@pytest.fixture
def client(tmp_path):
    client = connect(f"chdb://{tmp_path / 'ch'}")
    ensure_schema(client)
    yield client
    client.close()


def test_placement_events_round_trip_through_the_store(client) -> None:
    topics = topic_names("t")
    routes = routes_for(topics)
    events = [
        (topics.gpu_personalities, GpuPersonalityEvent(
            event_time_ms=T_MS, scope="gpu", gpu_uuid="GPU-a", gpu_model="X", node_id="n1",
            pool="p", regimes={"long": RegimeStats(leak_bytes_per_s=2e6, ooms=1,
                                                   observed_s=90.0)},
            stability_score={"long": 0.3}, confidence=0.1, first_seen_ms=T_MS - 90_000,
            last_seen_ms=T_MS)),
        # a later version of the same row: FINAL keeps this one
        (topics.gpu_personalities, GpuPersonalityEvent(
            event_time_ms=T_MS + 1, scope="gpu", gpu_uuid="GPU-a", gpu_model="X", node_id="n1",
            pool="p", regimes={"long": RegimeStats(leak_bytes_per_s=3e6, ooms=2,
                                                   observed_s=95.0)},
            stability_score={"long": 0.2}, first_seen_ms=T_MS - 90_000, last_seen_ms=T_MS)),
        (topics.workload_affinity, WorkloadAffinityEvent(
            event_time_ms=T_MS, workload="ppo", gpu_model="X", ooms=2, stable_s=60.0,
            observed_s=95.0, first_seen_ms=T_MS - 95_000, last_seen_ms=T_MS)),
        (topics.gpu_health, GpuHealthEvent(
            event_time_ms=T_MS, gpu_uuid="GPU-a", state="degraded", since_ms=T_MS - 5_000,
            signal="thermal_throttle", policy_name="gpu-thermal")),
        (topics.gpu_topology, GpuTopologyEvent(
            event_time_ms=T_MS, node_id="n1", gpu_uuid="GPU-a", gpu_model="X", gpu_index=0,
            numa_node=1, cpu_affinity=[8, 9], links={"GPU-b": "nvlink"}, nvlink_active=4)),
    ]
    for topic, event in events:
        route = routes[topic]
        client.insert(route.table, route.to_rows(event), column_names=route.columns)
    history = read_history(lambda sql: run_readonly(client, threading.Lock(), sql))
    gpu = history.gpus["GPU-a"]
    assert (gpu.node_id, gpu.pool) == ("n1", "p")
    assert gpu.regimes["long"]["ooms"] == 2 and gpu.regimes["long"]["stability_score"] == 0.2
    assert history.affinity[("ppo", "X")].ooms == 2
    health = history.health["GPU-a"]
    assert (health.state, health.since_ms, health.signal) == (
        "degraded", T_MS - 5_000, "thermal_throttle")
    topology = history.topology["GPU-a"]
    assert (topology.numa_node, topology.cpu_affinity, topology.links) == (
        1, (8, 9), {"GPU-b": "nvlink"})


def test_dsec_placement_recommend_reads_the_embedded_store(tmp_path) -> None:
    import json

    from typer.testing import CliRunner

    from dsec.cli import app

    client = connect(f"chdb://{(tmp_path / 'clickhouse').resolve()}")
    ensure_schema(client)
    route = routes_for(topic_names("t"))[topic_names("t").gpu_personalities]
    for uuid, score in (("GPU-good", 0.9), ("GPU-bad", 0.1)):
        event = GpuPersonalityEvent(
            event_time_ms=T_MS, scope="gpu", gpu_uuid=uuid, gpu_model="X", node_id="n1",
            regimes={"all": RegimeStats(observed_s=600.0)}, stability_score={"all": score},
            first_seen_ms=T_MS, last_seen_ms=T_MS)
        client.insert(route.table, route.to_rows(event), column_names=route.columns)
    client.close()
    result = CliRunner().invoke(app, ["placement", "recommend", "--workload", "ppo", "--json",
                                      "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output)
    assert answer["chosen"] == ["GPU-good"]
    assert [g["gpu_uuid"] for g in answer["ranked"]] == ["GPU-good", "GPU-bad"]
