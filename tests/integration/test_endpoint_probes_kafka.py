"""Probes in endpoint mode on real parts: the Python probe and the C library
(``libdsec_inject.so``, preloaded into an unchanged program and through ctypes) post to the
ingest gateway, which publishes to the real broker, and the sink stores the samples in
ClickHouse (chDB)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from gateway_server import ServedGateway, serve
from helpers import start_stack, stop_stack, wait_for
from native_build import LIBRARY, TRAIN_PROGRAM, build_library_and_program

import dsec
from dsec.history import query
from dsec.ingest import ProbeConfig
from dsec.ingest.gateway_config import GatewayConfig
from dsec.schemas.settings import DsecSettings
from dsec.services.gateway import build_gateway

pytestmark = pytest.mark.integration
TOKEN = "enrolment-token"


@dataclass
class Plant:
    settings: DsecSettings
    gateway: ServedGateway


@pytest.fixture(scope="module")
def plant(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plant]:
    """The sink (its own process, its own topics and store) and the gateway, on the
    session broker."""
    build_library_and_program()
    data_dir = tmp_path_factory.mktemp("endpoint")
    settings = DsecSettings(bootstrap=kafka_bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}",
                            job_id="test-job", data_dir=data_dir)
    stack = start_stack(kafka_bootstrap, data_dir, settings.topic_prefix, services="sink")
    config = GatewayConfig(token=TOKEN)
    service = build_gateway(settings, config, webhooks=False)
    try:
        with serve(service.gateway, config) as gateway:
            yield Plant(settings, gateway)
    finally:
        service.close()
        stop_stack(stack)


def _kinds(settings: DsecSettings, worker_id: str, at_least: dict[str, int]) -> dict:
    """Sample counts by kind in ClickHouse, once they reach ``at_least``."""

    def stored() -> dict | None:
        rows = query(settings, "SELECT kind, count() FROM raw_metrics WHERE worker_id = "
                               f"'{worker_id}' GROUP BY kind")["rows"]
        kinds = dict(rows)
        return kinds if all(kinds.get(k, 0) >= n for k, n in at_least.items()) else None

    return wait_for(stored, 90, interval_s=1.0, what=f"{worker_id}'s samples in ClickHouse")


def test_a_probe_in_endpoint_mode_lands_in_clickhouse(plant: Plant, tmp_path) -> None:
    settings = plant.settings.model_copy(update={"data_dir": tmp_path / "worker"})
    dsec.init(worker_id="endpoint-rank-0", settings=settings, endpoint=plant.gateway.url,
              endpoint_token=TOKEN, probe_config=ProbeConfig(
                  flush_interval_s=0.05, step_sample_every_n_steps=1, grad_sync_timing=False))
    try:
        for step in range(40):
            dsec.report_step(1.0 / (step + 1))
            if step % 4 == 3:
                dsec.report_episode_end(float(step), 4)
    finally:
        counters = dsec.shutdown()
    assert counters is not None and counters.samples_dropped == 0
    kinds = _kinds(plant.settings, "endpoint-rank-0",
                   {"step": 40, "episode": 10, "heartbeat": 1, "runtime": 1})
    assert sum(kinds.values()) - kinds["runtime"] == counters.samples_sent  # once each


def test_a_gateway_gone_mid_run_costs_counted_samples_and_no_steps(plant: Plant,
                                                                   tmp_path) -> None:
    """Stored samples are exactly those the probe counted as sent; the rest it counted as
    dropped, and the loop ran on at its pace."""
    config = GatewayConfig(token=TOKEN)
    service = build_gateway(plant.settings, config, webhooks=False)
    settings = plant.settings.model_copy(update={"data_dir": tmp_path / "worker"})
    with serve(service.gateway, config) as gateway:
        dsec.init(worker_id="endpoint-outage", settings=settings, endpoint=gateway.url,
                  endpoint_token=TOKEN, probe_config=ProbeConfig(
                      flush_interval_s=0.05, step_sample_every_n_steps=1,
                      grad_sync_timing=False, message_timeout_s=1.0,
                      shutdown_flush_timeout_s=1.0))
        for step in range(100):
            dsec.report_step(float(step))
        wait_for(lambda: dsec.current().probe.counters().samples_sent >= 100, 30,
                 what="the steps before the outage sent")
    service.close()
    started = time.perf_counter()
    for step in range(100, 5100):
        dsec.report_step(float(step))
    loop_s = time.perf_counter() - started
    time.sleep(1.5)  # past the message timeout
    counters = dsec.shutdown()
    assert counters is not None
    assert counters.samples_dropped >= 5000
    assert counters.samples_recorded == counters.samples_sent + counters.samples_dropped
    assert loop_s < 5.0  # about 1 ms a step would mean the loop waited on the network
    kinds = _kinds(plant.settings, "endpoint-outage", {"step": 100})
    time.sleep(3)  # anything more would have arrived by now
    kinds = _kinds(plant.settings, "endpoint-outage", {"step": 100})
    assert sum(kinds.values()) - kinds["runtime"] == counters.samples_sent


def test_a_preloaded_program_lands_in_clickhouse_with_no_change(plant: Plant) -> None:
    env = {**os.environ, "LD_PRELOAD": str(LIBRARY), "DSEC_ENDPOINT": plant.gateway.url,
           "DSEC_ENDPOINT_TOKEN": TOKEN, "DSEC_WORKER_ID": "native-sandbox-1",
           "DSEC_JOB_ID": plant.settings.job_id}
    done = subprocess.run([str(TRAIN_PROGRAM), "16", "131072"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    did = json.loads(done.stdout)
    kinds = _kinds(plant.settings, "native-sandbox-1",
                   {"grad_sync": did["all_reduces"], "cuda_memory": 1, "heartbeat": 1})
    assert kinds["grad_sync"] == did["all_reduces"] == 15
    rows = query(plant.settings, "SELECT max(values['oom_count']), "
                                 "argMax(values['allocated_bytes'], event_time), "
                                 "max(values['peak_allocated_bytes']) FROM raw_metrics WHERE "
                                 "worker_id = 'native-sandbox-1' AND kind = 'cuda_memory'")
    [[ooms, allocated, peak]] = rows["rows"]
    assert ooms == did["ooms"] == 1
    assert allocated == did["weights_bytes"] and peak >= 2 * did["weights_bytes"]
    syncs = query(plant.settings, "SELECT min(values['bytes']), max(values['bytes']), "
                                  "min(values['latency_ms']), any(labels['op']) FROM "
                                  "raw_metrics WHERE worker_id = 'native-sandbox-1' AND "
                                  "kind = 'grad_sync'")["rows"]
    assert syncs == [[did["all_reduce_bytes"], did["all_reduce_bytes"], pytest.approx(
        syncs[0][2]), "nccl_all_reduce"]] and syncs[0][2] >= 0.2


def test_the_three_ctypes_lines_land_in_clickhouse(plant: Plant) -> None:
    script = textwrap.dedent(f"""
        from dsec import native
        lib = native.load()
        lib.dsec_init(b"{plant.gateway.url}", b"ctypes-agent-7")
        lib.dsec_report_episode_end(12.5, 200)
        lib.dsec_shutdown()
    """)
    done = subprocess.run([sys.executable, "-c", script], timeout=60, capture_output=True,
                          text=True, env={**os.environ, "DSEC_ENDPOINT_TOKEN": TOKEN,
                                          "DSEC_NATIVE_LIBRARY": str(LIBRARY)})
    assert done.returncode == 0, done.stderr
    _kinds(plant.settings, "ctypes-agent-7", {"episode": 1})
    rows = query(plant.settings, "SELECT values['reward'], values['length'] FROM raw_metrics "
                                 "WHERE worker_id = 'ctypes-agent-7' AND kind = 'episode'")
    assert rows["rows"] == [[12.5, 200.0]]
