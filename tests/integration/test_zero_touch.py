"""``dsec run`` on real parts: an unmodified two-rank PPO under torchrun publishes every signal
the hand-instrumented job does (tests/integration/test_probe_end_to_end.py), stored in
ClickHouse, and applies a snapshot command; without a broker the program runs as it would."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from helpers import wait_for
from test_probe_end_to_end import consume_batches

from dsec.actuators.restore import restore
from dsec.history import query
from dsec.infra.kafka_clients import producer_config
from dsec.infra.kafka_local import free_port
from dsec.infra.keys import signer_for, signing_env
from dsec.schemas import (
    ActuationCommand,
    WorkerIdentity,
    encode,
    new_event_id,
    now_ms,
    topic_names,
)
from dsec.schemas.actuations import SnapshotParams
from dsec.schemas.trust import KeyRole
from dsec.zerotouch.identity import safe_id

pytestmark = pytest.mark.integration
TESTS = Path(__file__).parents[1]
SCRIPT = TESTS / "plain_ppo.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"
# the hand-instrumented job's kinds; cuda_memory needs a GPU, which neither job has
HAND_INSTRUMENTED_KINDS = {"step", "episode", "grad_sync", "gpu", "heartbeat"}


def _rows(settings, sql: str) -> list:
    return query(settings, sql)["rows"]


def _environment(**variables: str) -> dict[str, str]:
    """This environment, with the NVML test double first on the path (no GPU here)."""
    python_path = [str(TESTS / "nvml_shim"), *filter(None, os.environ.get(
        "PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(python_path), **variables}


def test_unmodified_two_rank_ppo_under_torchrun_publishes_every_signal_and_snapshots(
        running_stack, tmp_path) -> None:
    settings = running_stack
    sandbox = f"sbx-{uuid.uuid4().hex[:6]}"
    workers = [f"{sandbox}-rank{rank}" for rank in range(2)]
    node = safe_id(socket.gethostname())
    data_dir = tmp_path / "worker-data"
    env = _environment(
        DSEC_BOOTSTRAP=settings.bootstrap, DSEC_TOPIC_PREFIX=settings.topic_prefix,
        DSEC_JOB_ID=settings.job_id, DSEC_DATA_DIR=str(data_dir),
        DSEC_ACTUATOR_CHANNEL="kafka", **signing_env(settings),
        DSEC_PROBE_GPU_SAMPLE_INTERVAL_S="0.2", DSEC_PROBE_STEP_SAMPLE_EVERY_N_STEPS="1",
    )
    program = subprocess.Popen(
        [sys.executable, "-m", "dsec.cli", "run", "--sandbox-id", sandbox,
         "--heartbeat-interval-s", "0.5", "--",
         str(TORCHRUN), "--nproc-per-node", "2", "--master-port", str(free_port()),
         str(SCRIPT), "--updates", "4", "--seconds", "20"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)  # torchrun and its ranks: one group to kill if need be
    try:
        # both ranks publish once their first step or episode started their runtime
        consume_batches(settings.bootstrap, topic_names(settings.topic_prefix).metrics,
                        lambda got: {b.identity.worker_id for b in got} >= set(workers), 90)
        time.sleep(2.0)  # the rank's command consumer takes its partitions meanwhile
        command = signer_for(settings, KeyRole.COMMAND_SIGNER).sign(ActuationCommand(
            actuation_id=new_event_id(), expires_at_ms=now_ms() + 60_000,
            target=WorkerIdentity(job_id=settings.job_id, worker_id=workers[0], node_id=node),
            policy_name="test", policy_version=1, action=SnapshotParams(),
        ))
        producer = Producer(producer_config(settings, client_id="test-commands"))
        producer.produce(topic_names(settings.topic_prefix).actuations, key=node.encode(),
                         value=encode(command))
        assert producer.flush(10) == 0
        del producer  # no reconnecting to a broker the session stops later
        out, err = program.communicate(timeout=180)
    finally:
        if program.poll() is None:
            program.terminate()  # torchrun stops its ranks, each in a session of its own
            try:
                program.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(program.pid, signal.SIGKILL)
                program.communicate()
    assert program.returncode == 0, err[-4000:]
    assert out.count("update ") >= 4  # the program's own output, as it prints it

    def kinds_of(worker: str) -> set[str]:
        return {kind for kind, in _rows(
            settings, f"SELECT DISTINCT kind FROM raw_metrics WHERE worker_id = '{worker}'")}

    for worker in workers:
        wait_for(lambda w=worker: kinds_of(w) >= HAND_INSTRUMENTED_KINDS, 60,
                 what=f"every kind of sample of {worker} in ClickHouse")
        ops = dict(_rows(settings, "SELECT op, count() FROM raw_grad_sync WHERE worker_id = "
                                   f"'{worker}' GROUP BY op"))
        assert ops["all_reduce"] >= 4 and ops["ddp_bucket_all_reduce"] >= 8, ops
        steps = _rows(settings, "SELECT count(), countIf(grad_norm > 0), countIf(loss IS NOT "
                                f"NULL) FROM raw_step WHERE worker_id = '{worker}'")[0]
        assert steps[0] >= 8 and steps[1] == steps[0] and steps[2] == steps[0], steps
        sources = {s for s, in _rows(settings, "SELECT DISTINCT grad_norm_source FROM "
                                               f"raw_step WHERE worker_id = '{worker}'")}
        assert sources == {"trainer"}  # the program's own clip_grad_norm_
        gpus = {g for g, in _rows(settings, "SELECT DISTINCT gpu_uuid FROM raw_gpu WHERE "
                                            f"worker_id = '{worker}'")}
        local_rank = int(worker[-1])
        assert gpus == {f"GPU-0000000{local_rank}-aaaa-bbbb"}  # each rank its own GPU
        episodes = _rows(settings, "SELECT count(), min(length) FROM raw_episode WHERE "
                                   f"worker_id = '{worker}'")[0]
        assert episodes[0] >= 4 and episodes[1] > 0

    results = wait_for(lambda: _rows(
        settings, "SELECT status, detail FROM actuation_results WHERE actuation_id = "
                  f"'{command.actuation_id}'"), 60, what="the snapshot's result")
    assert results[0][0] == "applied", results
    # (the stack's periodic snapshot policy may have taken some before)
    assert re.match(r"snapshot \d+ started at step \d+: parameters and state of 1 "
                    r"optimizer\(s\)$", results[0][1]), results
    restored = restore(data_dir / "snapshots" / workers[0], restore_rng=False)
    params = [name for name in restored.tensors if name.startswith("model.")]
    assert len(params) == 8  # two linear layers each for the policy and the value
    assert any(name.endswith(".exp_avg") for name in restored.tensors)  # Adam's state


def test_without_a_broker_the_program_runs_unchanged_and_counts_its_drops(tmp_path) -> None:
    command = [sys.executable, str(SCRIPT), "--updates", "2"]
    plain = subprocess.run(command, env=_environment(), capture_output=True, text=True,
                           timeout=180)
    assert plain.returncode == 0, plain.stderr[-4000:]
    instrumented = subprocess.run(
        [sys.executable, "-m", "dsec.cli", "run", "--endpoint", f"127.0.0.1:{free_port()}",
         "--", *command],
        env=_environment(DSEC_DATA_DIR=str(tmp_path / "dsec"),
                         DSEC_ACTUATOR_CHANNEL="kafka",
                         DSEC_PROBE_SHUTDOWN_FLUSH_TIMEOUT_S="1"),
        capture_output=True, text=True, timeout=180)
    assert instrumented.returncode == 0, instrumented.stderr[-4000:]
    assert instrumented.stdout == plain.stdout  # the same losses and returns, line for line
    dropped = [line for line in instrumented.stderr.splitlines() if "dropped" in line]
    assert len(dropped) == 1 and "messages not delivered to 127.0.0.1:" in dropped[0], (
        instrumented.stderr)
    assert "dropped 0 " not in dropped[0]
    assert len(instrumented.stderr.splitlines()) <= 5  # each failure said once
