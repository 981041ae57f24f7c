"""A worker node cut off from Kafka by a network partition, with network namespaces.

The node (its actuator daemon and a training worker, ``tests/partition_worker.py``) runs in
a namespace of its own and reaches the broker only through a veth pair; the broker listens
on the host end's address. Taking the namespace's end down cuts the node off: its probe
buffers what it records, drops and counts what no longer fits, and resumes sending when
the link is back; a command issued during the cut arrives expired and is answered
``stale``; no command is applied twice. Skipped, with the reason, where ``ip netns`` is
not permitted (it needs root or CAP_NET_ADMIN).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from helpers import wait_for

from dsec.actuators.channel import socket_path
from dsec.infra.kafka_clients import consumer_config, producer_config
from dsec.infra.kafka_local import LocalKafka
from dsec.infra.keys import signer_for, signing_env
from dsec.infra.topics import ensure_topics
from dsec.schemas import (
    ActuationCommand,
    ActuationResult,
    ActuationStatus,
    WorkerIdentity,
    decode,
    encode,
    new_event_id,
    now_ms,
    topic_names,
)
from dsec.schemas.actuations import SamplerParams
from dsec.schemas.settings import DsecSettings
from dsec.schemas.trust import KeyRole

pytestmark = pytest.mark.integration

NODE = "node-p"
WORKER = "w-partitioned"
CUT_S = 12.0
COMMAND_TTL_MS = 4_000  # shorter than the cut: a command sent during it expires on the way


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


class VethNamespace:
    """A network namespace joined to the host by a veth pair on a /30 of its own."""

    def __init__(self) -> None:
        suffix = uuid.uuid4().hex[:6]
        self.name = f"dsec{suffix}"
        self.host_if, self.ns_if = f"vh{suffix}", f"vn{suffix}"
        subnet = f"10.{random.randint(64, 127)}.{random.randint(0, 255)}"
        self.host_ip, self.ns_ip = f"{subnet}.1", f"{subnet}.2"

    def create(self) -> str | None:
        """None once made, else why it cannot be."""
        if shutil.which("ip") is None:
            return "no ip command (iproute2)"
        made = _ip("netns", "add", self.name)
        if made.returncode != 0:
            return f"ip netns add is not permitted here: {made.stderr.strip()}"
        for args in (
            ("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if),
            ("link", "set", self.ns_if, "netns", self.name),
            ("addr", "add", f"{self.host_ip}/30", "dev", self.host_if),
            ("link", "set", self.host_if, "up"),
            ("-n", self.name, "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if),
            ("-n", self.name, "link", "set", self.ns_if, "up"),
            ("-n", self.name, "link", "set", "lo", "up"),
        ):
            step = _ip(*args)
            if step.returncode != 0:
                self.delete()
                return f"ip {' '.join(args)} failed: {step.stderr.strip()}"
        return None

    def cut(self) -> None:
        # The namespace's end goes down: the host keeps its address (the broker still
        # listens there for everyone else), the node loses its only route to it.
        assert _ip("-n", self.name, "link", "set", self.ns_if, "down").returncode == 0

    def heal(self) -> None:
        assert _ip("-n", self.name, "link", "set", self.ns_if, "up").returncode == 0

    def run(self, command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
        with log.open("wb") as handle:
            return subprocess.Popen(["ip", "netns", "exec", self.name, *command], env=env,
                                    stdout=handle, stderr=subprocess.STDOUT)

    def delete(self) -> None:
        _ip("link", "del", self.host_if)
        _ip("netns", "del", self.name)


@pytest.fixture
def namespace():
    space = VethNamespace()
    why_not = space.create()
    if why_not is not None:
        pytest.skip(why_not)
    try:
        yield space
    finally:
        space.delete()


def _read_state(path: Path) -> dict | None:
    import json

    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class Commands:
    """Signed commands for the partitioned worker, and the answers its node sends back."""

    def __init__(self, settings: DsecSettings) -> None:
        self.settings = settings
        self.topics = topic_names(settings.topic_prefix)
        self.signer = signer_for(settings, KeyRole.COMMAND_SIGNER)
        self.producer = Producer(producer_config(settings, client_id="test-engine"))
        self.consumer = Consumer(consumer_config(settings, f"test-{uuid.uuid4().hex[:6]}"))
        self.consumer.subscribe([self.topics.actuation_results])
        self.results: list[ActuationResult] = []

    def send(self, paused: bool, ttl_ms: int = 60_000) -> ActuationCommand:
        at = now_ms()
        command = self.signer.sign(ActuationCommand(
            actuation_id=new_event_id(), event_time_ms=at, expires_at_ms=at + ttl_ms,
            target=WorkerIdentity(job_id=self.settings.job_id, worker_id=WORKER,
                                  node_id=NODE),
            policy_name="test-partition", policy_version=1,
            action=SamplerParams(paused=paused)))
        self.producer.produce(self.topics.actuations, key=NODE.encode(), value=encode(command))
        assert self.producer.flush(10) == 0
        return command

    def poll(self) -> list[ActuationResult]:
        while (message := self.consumer.poll(0.1)) is not None:
            if not message.error():
                self.results.append(decode(message.value(), ActuationResult))
        return self.results

    def answer(self, command: ActuationCommand, timeout_s: float) -> ActuationResult:
        return wait_for(lambda: next((r for r in self.poll()
                                      if r.actuation_id == command.actuation_id), None),
                        timeout_s, what=f"the answer to {command.action}")

    def close(self) -> None:
        self.consumer.close()


def test_a_cut_off_node_buffers_counts_drops_resumes_and_refuses_stale_commands(
    namespace: VethNamespace, tmp_path: Path,
) -> None:
    broker = LocalKafka(data_dir=tmp_path / "kafka", host=namespace.host_ip, heap_mb=384,
                        start_timeout_s=240.0)
    run_dir = Path(tempfile.mkdtemp(prefix="dsec-run-"))  # short: socket paths are limited
    processes: list[subprocess.Popen] = []
    commands: Commands | None = None
    try:
        broker.start()
        settings = DsecSettings(bootstrap=broker.bootstrap,
                                topic_prefix=f"t{uuid.uuid4().hex[:10]}", job_id="partition",
                                data_dir=tmp_path / "dsec", run_dir=run_dir,
                                actuator_channel="node")
        ensure_topics(settings, partitions=1)
        commands = Commands(settings)  # makes the keys the node's trust list names
        env = {**os.environ, **signing_env(settings),
               "DSEC_BOOTSTRAP": settings.bootstrap, "DSEC_TOPIC_PREFIX": settings.topic_prefix,
               "DSEC_JOB_ID": settings.job_id, "DSEC_RUN_DIR": str(run_dir),
               "DSEC_DATA_DIR": str(settings.data_dir), "DSEC_ACTUATOR_CHANNEL": "node",
               "DSEC_METRICS_PORT": "0",
               # a sample every step and a small buffer: a cut of seconds overflows it
               "DSEC_PROBE_STEP_SAMPLE_EVERY_N_STEPS": "1",
               "DSEC_PROBE_BUFFER_MAX_SAMPLES": "200",
               "DSEC_PROBE_TRANSPORT_QUEUE_MAX_MESSAGES": "4"}
        processes.append(namespace.run(
            [sys.executable, "-m", "dsec.cli", "actuator", "--node", NODE], env,
            tmp_path / "actuator.log"))
        wait_for(socket_path(run_dir, NODE).exists, 120, what="the node actuator's socket")
        state_path = tmp_path / "worker.json"
        worker_script = Path(__file__).parents[1] / "partition_worker.py"
        processes.append(namespace.run(
            [sys.executable, str(worker_script), WORKER, NODE, str(state_path)], env,
            tmp_path / "worker.log"))

        def state() -> dict:
            got = _read_state(state_path)
            assert processes[-1].poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            return got or {"registered": False, "probe": {"samples_sent": 0}}

        wait_for(lambda: state()["registered"] and state()["probe"]["samples_sent"] > 0, 120,
                 what="the worker registered and its probe sending")

        before = commands.send(paused=True)
        assert commands.answer(before, 60).status is ActuationStatus.APPLIED
        assert wait_for(lambda: state()["in_force"]["sampler_paused"] is True, 30)

        namespace.cut()
        cut_at = state()["probe"]
        during = commands.send(paused=False, ttl_ms=COMMAND_TTL_MS)
        time.sleep(CUT_S)
        in_cut = state()["probe"]
        assert in_cut["samples_dropped"] > cut_at["samples_dropped"], (cut_at, in_cut)
        assert in_cut["samples_buffered"] > 0
        assert state()["in_force"]["sampler_paused"] is True  # nothing got through

        namespace.heal()
        answer = commands.answer(during, 120)
        assert answer.status is ActuationStatus.STALE, answer
        healed_at = state()["probe"]
        wait_for(lambda: state()["probe"]["samples_sent"] > healed_at["samples_sent"] + 200
                 and state()["probe"]["samples_buffered"] < 200, 120,
                 what="the probe sending again")
        after = commands.send(paused=False)
        assert commands.answer(after, 60).status is ActuationStatus.APPLIED
        wait_for(lambda: state()["in_force"]["sampler_paused"] is False, 30)

        final = state()["probe"]
        assert final["samples_recorded"] == (final["samples_sent"] + final["samples_buffered"]
                                             + final["samples_dropped"])
        time.sleep(2.0)  # any late duplicate answer has time to arrive
        applied = Counter(r.actuation_id for r in commands.poll()
                          if r.status is ActuationStatus.APPLIED)
        assert applied == {before.actuation_id: 1, after.actuation_id: 1}
        print(f"partition: cut {CUT_S:.0f} s; probe at the cut {cut_at}, at its end {in_cut}, "
              f"finally {final}; the command sent in the cut: {answer.status.value} "
              f"({answer.detail})")
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
        if commands is not None:
            commands.close()
        broker.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
