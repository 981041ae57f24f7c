"""``dsec demo``: the local stack plus N real training workers, then a summary from ClickHouse."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dsec.infra.kafka_clients import consumer_config
from dsec.infra.kafka_local import LocalKafka
from dsec.infra.keys import signing_env
from dsec.infra.store.clickhouse import connect
from dsec.infra.store.sink import wait_until_drained
from dsec.infra.topics import ensure_topics
from dsec.schemas import topic_names
from dsec.schemas.settings import DsecSettings
from dsec.services.stack import (
    SERVICES,
    read_stack_state,
    sink_group,
    stop_process,
    stream_group,
)


class DemoError(RuntimeError):
    pass


@dataclass(frozen=True)
class DemoOptions:
    workers: int = 4
    duration_s: float = 60.0
    workers_per_node: int = 2
    fault_workers: int = 1
    fault_at_fraction: float = 0.4
    seed: int = 0
    drain_timeout_s: float = 90.0


def _stack_env(settings: DsecSettings, job_id: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(signing_env(settings))
    env.update({
        "DSEC_BOOTSTRAP": settings.bootstrap,
        "DSEC_DATA_DIR": str(settings.data_dir.resolve()),
        "DSEC_TOPIC_PREFIX": settings.topic_prefix,
        "DSEC_JOB_ID": job_id,
        "PYTHONUNBUFFERED": "1",
    })
    return env


def _wait_for_stack(process: subprocess.Popen, data_dir: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise DemoError(f"the stack exited with {process.returncode} while starting")
        if read_stack_state(data_dir) is not None:
            return
        time.sleep(0.2)
    raise DemoError(f"the stack was not up after {timeout_s} s")


def count_job_rows(settings: DsecSettings, job_id: str, since_s: float) -> dict[str, int]:
    client = connect(settings.clickhouse_target())
    try:
        def scalar(sql: str, **params: object) -> int:
            return int(client.query(sql, parameters=params).result_rows[0][0])

        return {
            "metrics_stored": scalar(
                "SELECT count() FROM raw_metrics WHERE job_id = {job:String}", job=job_id),
            "features_stored": scalar(
                "SELECT count() FROM features WHERE job_id = {job:String}", job=job_id),
            "actuations_emitted": scalar(
                "SELECT count() FROM actuations WHERE job_id = {job:String}", job=job_id),
            "actuations_applied": scalar(
                "SELECT count() FROM actuation_results WHERE job_id = {job:String}"
                " AND status = 'applied'", job=job_id),
            # what a worker could not carry out (no hook for it) or has not yet
            "actuations_not_applied": scalar(
                "SELECT count() FROM actuation_results WHERE job_id = {job:String}"
                " AND status IN ('unsupported', 'deferred')", job=job_id),
            "dead_letters": scalar(
                "SELECT count() FROM dead_letters WHERE event_time >= toDateTime64({t:Float64}, 3)",
                t=since_s),
        }
    finally:
        client.close()


def run_demo(settings: DsecSettings, options: DemoOptions) -> dict:
    started_s = time.time()
    job_id = f"demo-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(started_s))}"
    data_dir = settings.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    if read_stack_state(data_dir) is not None:
        raise DemoError(f"a stack is already running on {data_dir}; stop it first")
    kafka_dir = data_dir / "kafka-demo"
    shutil.rmtree(kafka_dir, ignore_errors=True)
    kafka = LocalKafka(data_dir=kafka_dir)
    stack = None
    workers: list[subprocess.Popen] = []
    try:
        settings = settings.model_copy(update={"bootstrap": kafka.start(), "job_id": job_id})
        ensure_topics(settings)
        env = _stack_env(settings, job_id)
        stack_log = (data_dir / "stack.log").open("wb")
        stack = subprocess.Popen(
            [sys.executable, "-m", "dsec.cli", "up", "--bootstrap", settings.bootstrap],
            env=env, stdout=stack_log, stderr=subprocess.STDOUT,
        )
        _wait_for_stack(stack, data_dir, timeout_s=120)
        snapshot_dir = data_dir / "snapshots" / job_id
        for index in range(options.workers):
            command = [
                sys.executable, "-m", "dsec.demo.worker",
                "--worker-id", f"worker-{index:03d}",
                "--node-id", f"node-{index // options.workers_per_node:02d}",
                "--duration-s", str(options.duration_s),
                "--seed", str(options.seed + index),
                "--snapshot-dir", str(snapshot_dir),
            ]
            if index < options.fault_workers:
                command += ["--reward-fault-at-s",
                            str(options.duration_s * options.fault_at_fraction)]
            workers.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True))
        worker_summaries = []
        for process in workers:
            output, _ = process.communicate(timeout=options.duration_s + 120)
            lines = [line for line in output.splitlines() if line.startswith("{")]
            if process.returncode != 0 or not lines:
                raise DemoError(f"a worker exited with {process.returncode}")
            worker_summaries.append(json.loads(lines[-1]))
        topics = topic_names(settings.topic_prefix)
        all_topics = [topics.metrics, topics.features, topics.actuations,
                      topics.actuation_results, topics.decisions, topics.dead_letters]
        stream_consumer = consumer_config(settings, stream_group(settings, frozenset(SERVICES)))
        drained = wait_until_drained(stream_consumer, [topics.metrics, topics.features],
                                     options.drain_timeout_s)
        drained = drained and wait_until_drained(
            consumer_config(settings, sink_group(settings)), all_topics, options.drain_timeout_s)
        stop_process(stack)
        if stack.returncode not in (0, -signal.SIGINT):
            raise DemoError(f"the stack exited with {stack.returncode}; see {data_dir/'stack.log'}")
        stack = None
        summary = {"job_id": job_id, "workers": options.workers,
                   "duration_s": options.duration_s, "drained": drained}
        summary.update(count_job_rows(settings, job_id, started_s))
        summary["worker_summaries"] = worker_summaries
        summary["clickhouse"] = settings.clickhouse_target()
        return summary
    finally:
        for process in workers:
            if process.poll() is None:
                process.kill()
        if stack is not None:
            stop_process(stack)
        kafka.stop()
        shutil.rmtree(kafka_dir, ignore_errors=True)
