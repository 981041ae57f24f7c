"""``dsec bench reaction``: from a metric sample crossing a policy's threshold to the answer
applied inside the worker, on the real stack, over many trials.

Every part runs as in production, each in its own process: a Kafka broker (the project's
own KRaft broker, unless ``--bootstrap``), the stream jobs and the policy engine (``dsec up
--services stream-jobs,policy-engine``), a node actuator (``dsec actuator``) and a training
worker (``dsec.bench.reaction_worker``: ``dsec.init``, its probe, its apply hooks) that
takes commands from the node actuator over the node's socket.

The policy is the built-in ``precision-downgrade`` (``for_s: 0``): a NaN loss switches the
worker to fp16. Each trial has a worker id of its own, so no cooldown or hold of an
earlier trial hides it; a warm-up trial, not counted, waits out the stack's start (the
Faust consumer groups joining). The headline runs from the probe's flush publishing the
NaN step (its Kafka timestamp) to the apply hook running in the worker;
``recorded_to_applied_ms`` adds the wait for the probe's flush (a NaN/Inf sample is flushed
at once, not at the next interval).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dsec.actuators.channel import socket_path
from dsec.bench.reaction_figures import TrialRecord, reaction_figures
from dsec.bench.reaction_trace import read_stage_times
from dsec.infra.kafka_local import LocalKafka, die_with_parent
from dsec.infra.keys import signing_env
from dsec.infra.topics import ensure_topics
from dsec.ingest import ProbeConfig
from dsec.schemas.settings import DsecSettings
from dsec.services.stack import read_stack_state, stop_process

POLICY = "precision-downgrade"
NODE_ID = "bench-node"
TARGET_P99_MS = 1000.0


class ReactionBenchError(RuntimeError):
    def __init__(self, message: str, logs: Path) -> None:
        super().__init__(f"{message}; logs in {logs}")
        self.logs = logs


@dataclass(frozen=True)
class ReactionBenchOptions:
    trials: int = 30
    warmup_trials: int = 1
    trial_timeout_s: float = 10.0
    warmup_timeout_s: float = 120.0
    lead_in_s: float = 0.5
    step_interval_ms: float = 10.0
    start_timeout_s: float = 120.0
    bootstrap: str | None = None  # a running broker; else the project's own is started


def _environment(settings: DsecSettings) -> dict[str, str]:
    assert settings.run_dir is not None
    return {
        **os.environ,
        **signing_env(settings),
        "DSEC_BOOTSTRAP": settings.bootstrap,
        "DSEC_TOPIC_PREFIX": settings.topic_prefix,
        "DSEC_JOB_ID": settings.job_id,
        "DSEC_DATA_DIR": str(settings.data_dir),
        "DSEC_RUN_DIR": str(settings.run_dir),
        "DSEC_ACTUATOR_CHANNEL": "node",  # through the node actuator, never the worker's own
        "DSEC_POLICY_DRY_RUN": "0",
        "DSEC_METRICS_PORT": "0",  # nothing to scrape, and no port to collide on
        "PYTHONUNBUFFERED": "1",
    }


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as handle:
        return subprocess.Popen([sys.executable, "-m", *args], env=env, stdout=handle,
                                stderr=subprocess.STDOUT, preexec_fn=die_with_parent)


def _wait_until(ready: Callable[[], bool], process: subprocess.Popen[bytes], timeout_s: float,
                what: str, logs: Path) -> None:
    deadline_s = time.monotonic() + timeout_s
    while not ready():
        if process.poll() is not None:
            raise ReactionBenchError(f"{what} exited with {process.returncode}", logs)
        if time.monotonic() > deadline_s:
            raise ReactionBenchError(f"{what} not ready after {timeout_s} s", logs)
        time.sleep(0.1)


def _run_trials(options: ReactionBenchOptions, env: dict[str, str],
                work: Path) -> list[TrialRecord]:
    command = [sys.executable, "-m", "dsec.bench.reaction_worker", "--node-id", NODE_ID,
               "--trials", str(options.trials), "--warmup-trials", str(options.warmup_trials),
               "--timeout-s", str(options.trial_timeout_s),
               "--warmup-timeout-s", str(options.warmup_timeout_s),
               "--lead-in-s", str(options.lead_in_s),
               "--step-interval-ms", str(options.step_interval_ms)]
    longest_s = (options.warmup_trials * (options.warmup_timeout_s + options.lead_in_s + 15)
                 + options.trials * (options.trial_timeout_s + options.lead_in_s + 15))
    with (work / "worker.log").open("wb") as log:
        try:
            done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=log,
                                  timeout=longest_s, preexec_fn=die_with_parent)
        except subprocess.TimeoutExpired:
            raise ReactionBenchError(f"the worker took over {longest_s:.0f} s", work) from None
    records = [TrialRecord(**json.loads(line)) for line in done.stdout.decode().splitlines()
               if line.startswith("{")]
    if done.returncode != 0:
        missed = any(r.warmup and r.applied_ns is None for r in records)
        raise ReactionBenchError(
            "no command reached the worker in the warm-up trial" if missed
            else f"the worker exited with {done.returncode}", work)
    return records


def run_reaction_bench(options: ReactionBenchOptions) -> dict[str, object]:
    work = Path(tempfile.mkdtemp(prefix="dsec-bench-reaction-"))
    kafka = None if options.bootstrap else LocalKafka(data_dir=work / "kafka")
    services: list[subprocess.Popen[bytes]] = []
    started_s = time.monotonic()
    try:
        bootstrap = options.bootstrap or kafka.start()  # type: ignore[union-attr]
        settings = DsecSettings(
            bootstrap=bootstrap, topic_prefix=f"reaction{uuid.uuid4().hex[:8]}",
            job_id="bench-reaction", data_dir=work / "data", run_dir=work / "run",
            metrics_port=0,
        )
        settings.data_dir.mkdir()
        ensure_topics(settings)
        env = _environment(settings)
        stack = _spawn(["dsec.cli", "up", "--bootstrap", bootstrap,
                        "--services", "stream-jobs,policy-engine",
                        "--data-dir", str(settings.data_dir)], env, work / "stack.log")
        services.append(stack)
        _wait_until(lambda: read_stack_state(settings.data_dir) is not None, stack,
                    options.start_timeout_s, "the stream jobs and policy engine", work)
        actuator = _spawn(["dsec.cli", "actuator", "--node", NODE_ID, "--bootstrap", bootstrap,
                           "--run-dir", str(settings.run_dir)], env, work / "actuator.log")
        services.append(actuator)
        node_socket = socket_path(settings.run_dir, NODE_ID)  # type: ignore[arg-type]
        _wait_until(node_socket.exists, actuator, options.start_timeout_s,
                    "the node actuator", work)
        records = _run_trials(options, env, work)
        measured = [r.worker_id for r in records if not r.warmup]
        stages = read_stage_times(settings, measured, POLICY)
    finally:
        for process in reversed(services):
            stop_process(process)
        if kafka is not None:
            kafka.stop()
    shutil.rmtree(work, ignore_errors=True)  # kept above for its logs when the bench failed
    figures = reaction_figures(records, stages)
    return {
        **figures,
        "target_p99_ms": TARGET_P99_MS,
        "measured_from": "the probe's message holding the crossing sample (Kafka CreateTime)",
        "measured_to": "the worker's apply hook running (wall clock)",
        "policy": POLICY,
        "trigger": "a step whose loss is NaN, reported with dsec.report_step",
        "action": "precision fp16",
        "warmup_trials": options.warmup_trials,
        "trial_timeout_s": options.trial_timeout_s,
        "step_interval_ms": options.step_interval_ms,
        "probe_flush_interval_s": ProbeConfig().flush_interval_s,
        "broker": f"given at {options.bootstrap}" if options.bootstrap else "local, started",
        "wall_s": round(time.monotonic() - started_s, 1),
        "cpu_count": os.cpu_count(),
    }

