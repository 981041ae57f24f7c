"""The node actuator on the real broker: commands → daemon → Unix socket → worker → results."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import orjson
import pytest
import torch
import torch.distributed as dist
from confluent_kafka import Consumer, Producer
from helpers import wait_for
from keys import FORGER
from torch.nn.parallel import DistributedDataParallel

import dsec
from dsec.actuators import NodeActuator, NodeActuatorConfig
from dsec.infra.kafka_clients import consumer_config, producer_config
from dsec.infra.keys import signer_for, signing_env, verifier_for
from dsec.infra.topics import ensure_topics
from dsec.schemas import (
    ActuationCommand,
    ActuationResult,
    ActuationStatus,
    Signer,
    WorkerIdentity,
    decode,
    encode,
    new_event_id,
    now_ms,
    topic_names,
)
from dsec.schemas.actuations import (
    GIB,
    GradAccumulationParams,
    GradCompressionParams,
    MemoryCapParams,
    PrecisionParams,
    SamplerParams,
    SnapshotParams,
    SyncPriorityParams,
)
from dsec.schemas.trust import KeyRole

pytestmark = pytest.mark.integration

NODE = "node-a"


class Node:
    """A node actuator in this process, a command producer and a results reader."""

    def __init__(self, settings) -> None:
        self.settings = settings
        self.topics = topic_names(settings.topic_prefix)
        self.producer = Producer(producer_config(settings, client_id="test-commands"))
        self.daemon = NodeActuator(
            NodeActuatorConfig(node_id=NODE, run_dir=settings.run_directory(),
                               actuations_topic=self.topics.actuations,
                               results_topic=self.topics.actuation_results,
                               verifier=verifier_for(settings)),
            consumer_config(settings, group_id=f"dsec-node-{NODE}"),
            self._publish,
        )
        self.results_consumer = Consumer(consumer_config(
            settings, group_id=f"test-results-{uuid.uuid4().hex[:6]}"))
        self.results_consumer.subscribe([self.topics.actuation_results])
        self.results: list[ActuationResult] = []

    def _publish(self, topic: str, key: bytes, value: bytes) -> None:
        self.producer.produce(topic, key=key, value=value)
        self.producer.flush(10)

    def command(self, worker_id: str, action, *, sign_with: Signer | None = None,
                event_time_ms: int | None = None, ttl_ms: int = 60_000,
                actuation_id: str | None = None, node_id: str = NODE) -> ActuationCommand:
        at = event_time_ms if event_time_ms is not None else now_ms()
        command = ActuationCommand(
            actuation_id=actuation_id or new_event_id(), event_time_ms=at,
            expires_at_ms=at + ttl_ms,
            target=WorkerIdentity(job_id=self.settings.job_id, worker_id=worker_id,
                                  node_id=node_id),
            policy_name="test", policy_version=1, action=action,
        )
        signer = sign_with or signer_for(self.settings, KeyRole.COMMAND_SIGNER)
        return signer.sign(command)

    def send(self, command: ActuationCommand | bytes, node_id: str = NODE) -> None:
        value = command if isinstance(command, bytes) else encode(command)
        self.producer.produce(self.topics.actuations, key=node_id.encode(), value=value)
        self.producer.flush(10)

    def poll_results(self) -> list[ActuationResult]:
        while (message := self.results_consumer.poll(0.1)) is not None:
            if not message.error():
                self.results.append(decode(message.value(), ActuationResult))
        return self.results

    def send_each(self, worker_id: str, actions) -> list[ActuationCommand]:
        commands = [self.command(worker_id, action) for action in actions]
        for command in commands:
            self.send(command)
        return commands

    def all_answered(self, commands: list[ActuationCommand]) -> bool:
        ids = {r.actuation_id for r in self.poll_results()}
        return all(c.actuation_id in ids for c in commands)

    def answers_while(self, train, command: ActuationCommand, count: int = 1,
                      timeout_s: float = 60) -> list[ActuationResult]:
        """Runs ``train`` (a step of the worker's loop) until ``count`` results for
        ``command`` are in; those results."""

        def answered() -> list[ActuationResult] | None:
            train()
            mine = [r for r in self.poll_results() if r.actuation_id == command.actuation_id]
            return mine[:count] if len(mine) >= count else None

        return wait_for(answered, timeout_s, interval_s=0.02,
                        what=f"{count} result(s) for {command.action}")

    def result_for(self, actuation_id: str, count: int = 1,
                   timeout_s: float = 30) -> list[ActuationResult]:
        return wait_for(
            lambda: [r for r in self.poll_results() if r.actuation_id == actuation_id][:count]
            if len([r for r in self.poll_results() if r.actuation_id == actuation_id]) >= count
            else None, timeout_s, what=f"{count} result(s) for {actuation_id}")

    def close(self) -> None:
        self.daemon.stop()
        self.results_consumer.close()


@contextlib.contextmanager
def registered_worker(node, worker_id: str):
    """This process as a worker of the node (``dsec.init``) with a tiny model and its
    optimizer, registered on the node's socket; shut down after."""
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    runtime = dsec.init(worker_id=worker_id, node_id=NODE, optimizer=optimizer,
                        settings=node.settings)
    try:
        wait_for(lambda: runtime.channel.registered, 10, what="registration")
        yield model, optimizer
    finally:
        dsec.shutdown()


def every_action(memory_cap_bytes: int) -> list:
    return [MemoryCapParams(limit_bytes=memory_cap_bytes), PrecisionParams(dtype="fp16"),
            GradCompressionParams(bits=4), GradAccumulationParams(steps=4),
            SamplerParams(paused=True), SyncPriorityParams(level=-1), SnapshotParams()]


@pytest.fixture
def node(settings):
    run_dir = Path(tempfile.mkdtemp(prefix="dsec-run-"))  # short: socket paths are limited
    settings = settings.model_copy(update={"run_dir": run_dir, "actuator_channel": "node"})
    ensure_topics(settings, partitions=2)
    node = Node(settings)
    node.daemon.start()
    assert node.daemon.wait_ready(30)
    try:
        yield node
    finally:
        node.close()
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture
def gloo_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'gloo'}",
                            rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_socket_and_run_dir_are_owner_only(node) -> None:
    assert oct(node.daemon.socket_path.stat().st_mode & 0o777) == "0o600"
    assert oct(node.settings.run_directory().stat().st_mode & 0o777) == "0o700"


class SamplingThread:
    """The loop's asynchronous sampler: waits at the sampler gate before each batch."""

    def __init__(self, gate) -> None:
        import threading

        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(gate,), daemon=True)
        self.batches = 0
        self._thread.start()

    def _run(self, gate) -> None:
        while not self._stop.is_set():
            if gate.wait_until_running(0.02):
                self.batches += 1
                self._stop.wait(0.005)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def test_every_action_round_trips_and_changes_the_worker(node, gloo_group, tmp_path) -> None:
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    runtime = dsec.init(worker_id="w-all", node_id=NODE, optimizer=optimizer,
                        settings=node.settings)
    sampling = None
    try:
        assert runtime.channel is not None and runtime.actuator is None
        wait_for(lambda: runtime.channel.registered, 10, what="registration")
        controls = dsec.controls()
        dsec.watch_ddp(model)  # compression and sync priority act through its comm hook
        sampling = SamplingThread(controls.sampler)
        dsec.enable_snapshots(model, optimizer, directory=str(tmp_path / "snaps"),
                              extra_state=lambda: {"episode_head": 17})
        commands = node.send_each("w-all", every_action(4 * GIB))

        def train_until_answered() -> bool:
            with controls.grad_accumulation.micro_step(model) as sync:
                with dsec.autocast():
                    out = model(torch.randn(8, 16))
                loss = controls.grad_accumulation.scale(out.float().pow(2).mean())
                controls.precision.scaler.scale(loss).backward()
            if sync:
                controls.precision.step(optimizer)  # the step post-hook applies commands
                optimizer.zero_grad()
            return node.all_answered(commands)

        wait_for(train_until_answered, 60, interval_s=0.02, what="every action answered")
        by_id = {r.actuation_id: r for r in node.results}
        assert [by_id[c.actuation_id].status.value for c in commands] == ["applied"] * 7, [
            by_id[c.actuation_id].detail for c in commands]
        # each result read back what the loop runs with, beside what was asked
        assert [(by_id[c.actuation_id].requested, by_id[c.actuation_id].in_force)
                for c in commands[:6]] == [
            (str(4 * GIB), str(4 * GIB)), ("fp16", "fp16"), ("4", "4"), ("4", "4"),
            ("true", "true"), ("-1", "-1")]
        assert controls.in_force() == {
            "memory_cap_bytes": 4 * GIB, "precision": "fp16", "grad_compression_bits": 4,
            "grad_accumulation_steps": 4, "sampler_paused": True, "sync_priority": -1,
        }
        assert controls.requested() == controls.in_force()
        with torch.no_grad(), dsec.autocast():
            assert model(torch.randn(2, 16)).dtype == torch.float16
        assert controls.precision.scaler.is_enabled()
        all_reduced = []
        for _ in range(8):
            sent_before = controls.grad_compression.buckets_sent
            with controls.grad_accumulation.micro_step(model) as sync:
                model(torch.randn(8, 16)).float().sum().backward()
            all_reduced.append((sync, controls.grad_compression.buckets_sent > sent_before))
        assert sum(sync for sync, _ in all_reduced) == 2  # one sync every 4 micro-steps
        assert all(sync == reduced for sync, reduced in all_reduced), all_reduced
        assert controls.grad_compression.last_bits == 4
        assert not controls.sampler.wait_until_running(0.01)
        controls.snapshot.snapshotter.wait_idle(30)
        restored = dsec.restore(str(tmp_path / "snaps"), restore_rng=False)
        assert restored.meta["episode_head"] == 17
    finally:
        if sampling is not None:
            sampling.stop()
        dsec.shutdown()


UNATTACHED_HINTS = {
    "precision": "dsec.autocast()", "grad_compression": "dsec.watch_ddp(model)",
    "grad_accumulation": "micro_step(model)", "sampler": "wait_until_running()",
    "sync_priority": "dsec.watch_ddp(model)", "snapshot": "dsec.enable_snapshots",
}


def test_without_its_hook_an_action_is_unsupported_and_says_how_to_attach_it(node) -> None:
    # A plain loop: no autocast, no DDP, no accumulation helper, no sampling thread, no
    # snapshotter. Only the CPU memory budget is carried out, by the probe itself.
    with registered_worker(node, "w-bare") as (model, optimizer):
        commands = node.send_each("w-bare", every_action(64 * GIB))

        def train_until_answered() -> bool:
            optimizer.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            optimizer.step()
            return node.all_answered(commands)

        wait_for(train_until_answered, 60, interval_s=0.02, what="every action answered")
        by_kind = {c.action.kind.value: next(r for r in node.results
                                             if r.actuation_id == c.actuation_id)
                   for c in commands}
        assert by_kind.pop("memory_cap").status is ActuationStatus.APPLIED
        for kind, result in by_kind.items():
            assert result.status is ActuationStatus.UNSUPPORTED, (kind, result.detail)
            assert UNATTACHED_HINTS[kind] in result.detail, (kind, result.detail)
        assert by_kind["precision"].requested == "fp16"
        assert by_kind["precision"].in_force is None  # nothing ran under autocast
        controls = dsec.controls()
        assert controls.requested()["precision"] == "fp16"  # kept, should the loop attach
        assert controls.in_force()["precision"] is None


def test_undo_returns_an_fp32_worker_to_fp32_not_bf16(node) -> None:
    from dsec.policy_engine import load_builtin_policies

    pack = {spec.name: spec for spec in load_builtin_policies()}
    downgrade = pack["precision-downgrade"]
    [down] = downgrade.stage_actions(0)
    [undo] = downgrade.stage_actions(0, undo=True)  # what the engine sends once calm
    with registered_worker(node, "w-fp32") as (model, optimizer):
        x = torch.randn(8, 4)

        def step() -> torch.dtype:
            with dsec.autocast():  # this worker's own precision: fp32
                out = model(x)
            optimizer.zero_grad()
            out.float().pow(2).mean().backward()
            optimizer.step()
            return out.dtype

        assert step() == torch.float32
        results = []
        for action in (down, undo):
            [command] = node.send_each("w-fp32", [action])
            results.extend(node.answers_while(step, command))
            if action is down:
                assert step() == torch.float16
        assert [(r.status.value, r.requested, r.in_force) for r in results] == [
            ("applied", "fp16", "fp16"), ("applied", "fp32", "fp32")]
        assert step() == torch.float32
        assert dsec.controls().precision.state() == {
            "requested": "fp32", "in_force": "fp32", "original": "fp32"}


def test_a_memory_cap_below_what_the_worker_holds_is_deferred_then_applied(node) -> None:
    """On the simulated card, which fails an allocation past its fraction as CUDA does: the
    worker holds 9 GiB live when a 6 GiB cap comes. Set at once, its next step would OOM;
    the cap waits until the worker has let go of the held memory, then is applied."""
    from dsec.actuators.memory_cap import MemoryCap
    from dsec.experiment.sim_gpu import SimulatedGpu

    gpu = SimulatedGpu("GPU-sim-cap")
    with registered_worker(node, "w-cap") as (model, optimizer):
        dsec.controls().memory_cap = MemoryCap(cuda=gpu)
        gpu.hold(6 * GIB)
        gpu.fragment(5 * GIB)

        def step() -> None:
            gpu.set_working_set(3 * GIB)  # raises SimulatedOutOfMemoryError past the cap
            optimizer.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            optimizer.step()

        [command] = node.send_each("w-cap", [MemoryCapParams(limit_bytes=6 * GIB)])
        [deferred] = node.answers_while(step, command)
        assert deferred.status is ActuationStatus.DEFERRED, deferred.detail
        assert deferred.requested == str(6 * GIB) and deferred.in_force is None
        for _ in range(20):
            step()  # the worker trains on above the cap: nothing set, nothing fails
        assert gpu.fraction is None and gpu.fragmented_bytes == 0  # cached blocks released
        gpu.release_held()
        applied = node.answers_while(step, command, count=2)[1]
        assert applied.status is ActuationStatus.APPLIED, applied.detail
        assert applied.in_force == str(6 * GIB) and gpu.limit_bytes == 6 * GIB
        for _ in range(20):
            step()
            gpu.fragment(GIB)  # the leak goes on under the cap; the card never fills
        assert gpu.used_bytes <= 6 * GIB


def test_a_loop_applies_commands_at_a_safe_point_of_its_own(node) -> None:
    # Between two updates (a long rollout) no optimizer step comes; the loop says where.
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    runtime = dsec.init(worker_id="w-safe", node_id=NODE, optimizer=optimizer,
                        settings=node.settings)
    try:
        wait_for(lambda: runtime.channel.registered, 10, what="registration")
        command = node.command("w-safe", PrecisionParams(dtype="fp16"))
        node.send(command)
        wait_for(lambda: dsec.apply_pending() > 0, 30, interval_s=0.02, what="the command")
        assert dsec.controls().precision.dtype == "fp16"
        assert runtime.probe.global_step == 0
        answer = wait_for(lambda: next((r for r in node.poll_results()
                                        if r.actuation_id == command.actuation_id), None),
                          30, what="the answer")
        # this loop never ran a forward pass under dsec.autocast(): nothing carries it out
        assert answer.status is ActuationStatus.UNSUPPORTED and "autocast" in answer.detail
    finally:
        dsec.shutdown()


def _start_worker(node, worker_id: str, state_path: Path) -> subprocess.Popen:
    return _start_script(node, "node_worker.py", worker_id, str(state_path))


def _start_script(node, script: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "DSEC_BOOTSTRAP": node.settings.bootstrap,
           "DSEC_TOPIC_PREFIX": node.settings.topic_prefix, "DSEC_JOB_ID": node.settings.job_id,
           "DSEC_RUN_DIR": str(node.settings.run_directory()), "DSEC_ACTUATOR_CHANNEL": "node",
           **signing_env(node.settings), "DSEC_DATA_DIR": str(node.settings.data_dir)}
    path = Path(__file__).parents[1] / script
    return subprocess.Popen([sys.executable, str(path), *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _json_lines(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except OSError:
        return []


def test_sync_priority_changes_the_average_of_a_real_gloo_ddp_group(node, tmp_path) -> None:
    """Two ranks, each its own process with dsec.watch_ddp; rank 1 is sent level -2. From
    the step its hook used it, both ranks get (g0 + g1/4) / (1 + 1/4) instead of the
    mean, and the result says applied with the level the hook read back."""
    stop = tmp_path / "stop"
    outs = [tmp_path / f"rank-{rank}.jsonl" for rank in range(2)]
    ranks = [_start_script(node, "ddp_rank_worker.py", str(rank), "2",
                           str(tmp_path / "gloo-store"), str(out), str(stop))
             for rank, out in enumerate(outs)]
    try:
        wait_for(lambda: any(line["all_registered"] for line in _json_lines(outs[0])), 90,
                 what="both ranks registered")
        command = node.command("rank-1", SyncPriorityParams(level=-2))
        node.send(command)
        result = node.result_for(command.actuation_id, timeout_s=60)[0]
        assert result.status is ActuationStatus.APPLIED, result.detail
        assert (result.requested, result.in_force) == ("-2", "-2")
        wait_for(lambda: sum(line["level"] == -2 for line in _json_lines(outs[1])) >= 3, 60,
                 what="steps at the new level")
        stop.touch()
        for rank in ranks:
            assert rank.wait(60) == 0
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
                rank.wait(10)
    steps = [_json_lines(out) for out in outs]
    assert len(steps[0]) == len(steps[1])
    weighted_steps = 0
    for zero, one in zip(*steps, strict=True):
        levels = [zero["level"], one["level"]]
        weights = [2.0 ** level for level in levels]
        local = [torch.tensor(zero["local"]), torch.tensor(one["local"])]
        expected = (weights[0] * local[0] + weights[1] * local[1]) / sum(weights)
        for line in (zero, one):
            assert torch.allclose(torch.tensor(line["got"]), expected, atol=1e-5), levels
        if levels == [0, -2]:
            weighted_steps += 1
            assert not torch.allclose(expected, (local[0] + local[1]) / 2, atol=1e-4)
    assert weighted_steps >= 3
    assert steps[1][0]["level"] == 0  # before the command: the plain mean


def _read_state(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def test_killed_and_restarted_worker_gets_its_desired_state_back(node, tmp_path) -> None:
    state_path = tmp_path / "state.json"
    worker = _start_worker(node, "w-restart", state_path)
    try:
        wait_for(lambda: (_read_state(state_path) or {}).get("registered"), 60,
                 what="the worker to register")
        commands = [node.command("w-restart", action) for action in (
            PrecisionParams(dtype="bf16"), GradCompressionParams(bits=8),
            SamplerParams(paused=True), MemoryCapParams(limit_bytes=8 * GIB))]
        for command in commands:
            node.send(command)
        for command in commands:
            result = node.result_for(command.actuation_id)[0]
            assert result.status.value == "applied", result.detail
        first = wait_for(lambda: (s := _read_state(state_path)) and s["sampler_paused"]
                         and s, 30, what="the state written after the answers")
        assert first["precision"] == "bf16" and first["sampler_paused"] is True

        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        state_path.unlink()
        worker = _start_worker(node, "w-restart", state_path)
        desired = {"precision": "bf16", "grad_compression_bits": 8, "sampler_paused": True,
                   "memory_cap_bytes": 8 * GIB}

        def restored() -> dict | None:
            # the replayed commands land over a step or two: wait for all of them
            state = _read_state(state_path)
            return state if state and {k: state[k] for k in desired} == desired else None

        again = wait_for(restored, 60, what="the desired state back in the new worker")
        assert again["pid"] != first["pid"]
        replayed = node.result_for(commands[0].actuation_id, count=2)[1]
        assert replayed.status.value == "applied"
        assert replayed.detail.startswith("re-applied on registration")
    finally:
        worker.kill()
        worker.wait(10)


def test_bad_commands_are_rejected_and_reported(node) -> None:
    hooks_state = dsec.WorkerControls()
    from dsec.actuators import ApplyHooks, WorkerChannel

    hooks = ApplyHooks()
    hooks_state.register(hooks)
    worker = WorkerChannel(
        WorkerIdentity(job_id=node.settings.job_id, worker_id="w-bad", node_id=NODE),
        node.daemon.socket_path, hooks).start()

    def forward() -> None:  # the loop runs its forward pass under the autocast controller
        with hooks_state.precision():
            pass

    forward()
    try:
        good = node.command("w-bad", PrecisionParams(dtype="fp16"))
        node.send(good)
        node.send(good)  # duplicate
        expired = node.command("w-bad", SamplerParams(paused=True),
                               event_time_ms=now_ms() - 120_000)
        node.send(expired)
        unsigned = node.command("w-bad", SamplerParams(paused=True)).model_copy(
            update={"signature": None})
        node.send(unsigned)
        forged = node.command("w-bad", SamplerParams(paused=True), sign_with=FORGER)
        node.send(forged)
        out_of_bounds = orjson.loads(encode(node.command("w-bad", SyncPriorityParams(level=1))))
        out_of_bounds["action"] = {"kind": "memory_cap", "limit_bytes": 1}
        node.send(orjson.dumps(out_of_bounds))
        older = node.command("w-bad", PrecisionParams(dtype="bf16"),
                             event_time_ms=good.event_time_ms - 1_000)
        node.send(older)

        def answered() -> bool:
            worker.apply_pending()
            forward()
            return len(node.poll_results()) >= 7

        wait_for(answered, 30, what="seven results")
        statuses = {}
        for result in node.results:
            statuses.setdefault(result.actuation_id, []).append(
                (result.status.value, result.detail))
        assert sorted(statuses[good.actuation_id]) == [
            ("applied", "autocast fp32 -> fp16 with loss scaling"),
            ("rejected", "duplicate actuation id: not applied again")]
        assert statuses[expired.actuation_id][0][0] == "stale"
        assert statuses[unsigned.actuation_id][0] == ("rejected", "bad signature: unsigned")
        assert statuses[forged.actuation_id][0][0] == "rejected"
        assert statuses[out_of_bounds["actuation_id"]][0][0] == "rejected"
        assert "out of bounds" in statuses[out_of_bounds["actuation_id"]][0][1]
        assert statuses[older.actuation_id][0][0] == "stale"
        assert "out of order" in statuses[older.actuation_id][0][1]
        assert hooks_state.in_force()["precision"] == "fp16"
        assert hooks_state.requested()["sampler_paused"] is False  # nothing bad was applied
    finally:
        worker.stop()


def test_a_command_replaced_before_delivery_is_superseded(node) -> None:
    first = node.command("w-away", GradCompressionParams(bits=8))
    second = node.command("w-away", GradCompressionParams(bits=4))
    node.send(first)
    node.send(second)
    result = node.result_for(first.actuation_id)[0]
    assert result.status.value == "superseded" and second.actuation_id in result.detail


def test_dsec_actuator_command_serves_the_socket_until_signalled(settings) -> None:
    run_dir = Path(tempfile.mkdtemp(prefix="dsec-cli-"))
    ensure_topics(settings, partitions=2)
    env = {**os.environ, "DSEC_TOPIC_PREFIX": settings.topic_prefix,
           "DSEC_DATA_DIR": str(settings.data_dir)}
    process = subprocess.Popen(
        [sys.executable, "-m", "dsec.cli", "actuator", "--node", "node-cli",
         "--bootstrap", settings.bootstrap, "--run-dir", str(run_dir)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sock = run_dir / "actuator-node-cli.sock"
    try:
        wait_for(lambda: process.poll() is not None or sock.exists(), 60,
                 what="the actuator socket")
        assert process.poll() is None
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        assert not sock.exists()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        shutil.rmtree(run_dir, ignore_errors=True)


def test_single_process_mode_applies_and_rejects_without_a_daemon(settings) -> None:
    ensure_topics(settings, partitions=2)
    settings = settings.model_copy(update={"actuator_channel": "kafka"})
    kafka = Node(settings)  # producer and results reader only: no daemon started
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    runtime = dsec.init(worker_id="w-solo", node_id="node-solo", optimizer=optimizer,
                        settings=settings)
    try:
        assert runtime.actuator is not None and runtime.channel is None
        applied = kafka.command("w-solo", GradAccumulationParams(steps=2), node_id="node-solo")
        older = kafka.command("w-solo", GradAccumulationParams(steps=8), node_id="node-solo",
                              event_time_ms=applied.event_time_ms - 1_000)
        bad = orjson.loads(encode(kafka.command("w-solo", SamplerParams(paused=True),
                                                node_id="node-solo")))
        bad["action"] = {"kind": "grad_accumulation", "steps": 1000}
        # far below what a process with torch loaded holds: the soft budget is violated
        cap = kafka.command("w-solo", MemoryCapParams(limit_bytes=256 << 20),
                            node_id="node-solo")
        for command in (applied, older, cap):
            kafka.send(command, node_id="node-solo")
        kafka.send(orjson.dumps(bad), node_id="node-solo")

        accumulation = dsec.controls().grad_accumulation

        def answered() -> bool:
            with accumulation.micro_step() as sync:
                accumulation.scale(model(torch.randn(2, 4)).sum()).backward()
            if sync:
                optimizer.step()
                optimizer.zero_grad()
            else:
                dsec.apply_pending()  # between two optimizer steps: a safe point too
            return len(kafka.poll_results()) >= 5

        wait_for(answered, 60, interval_s=0.01, what="five results")
        cap_results = [(r.status.value, r.detail) for r in kafka.results
                       if r.actuation_id == cap.actuation_id]
        assert cap_results[0][0] == "applied" and "soft budget" in cap_results[0][1]
        assert cap_results[1][0] == "failed" and "budget exceeded" in cap_results[1][1]
        assert dsec.controls().memory_cap.violations >= 1
        statuses = {r.actuation_id: (r.status.value, r.detail) for r in kafka.results}
        assert statuses[applied.actuation_id][0] == "applied", statuses[applied.actuation_id]
        assert statuses[older.actuation_id][0] == "stale"
        assert statuses[bad["actuation_id"]][0] == "rejected"
        assert "out of bounds" in statuses[bad["actuation_id"]][1]
        assert dsec.controls().grad_accumulation.steps == 2
    finally:
        dsec.shutdown()
        kafka.results_consumer.close()


def test_restarted_daemon_keeps_desired_state_and_workers_reconnect(node) -> None:
    from dsec.actuators import ApplyHooks, WorkerChannel

    controls, hooks = dsec.WorkerControls(), ApplyHooks()
    controls.register(hooks)
    worker = WorkerChannel(
        WorkerIdentity(job_id=node.settings.job_id, worker_id="w-keep", node_id=NODE),
        node.daemon.socket_path, hooks, reconnect_interval_s=0.2).start()
    try:
        command = node.command("w-keep", GradCompressionParams(bits=8))
        node.send(command)
        wait_for(lambda: worker.apply_pending() or controls.grad_compression.bits == 8, 30,
                 what="the command applied")
        node.daemon.stop()
        controls.grad_compression.requested = 32  # as if the worker had lost it meanwhile
        node.daemon = NodeActuator(node.daemon.config, node.daemon._consumer_config,
                                   node._publish).start()
        wait_for(lambda: worker.apply_pending() or controls.grad_compression.bits == 8, 30,
                 what="the desired state from the restarted daemon")
        # Registered again with the restarted daemon: once, or more where a connection made
        # while the daemon was still starting up was closed and the worker came back.
        assert worker.registrations >= 2
    finally:
        worker.stop()


def test_the_node_takes_every_partition_without_joining_its_group(node) -> None:
    """No group membership: a broker too busy to answer heartbeats cannot time the node
    out of its group and hold it in a rebalance while commands wait."""
    from confluent_kafka.admin import AdminClient

    command = node.command("w-group", GradCompressionParams(bits=8),
                           event_time_ms=now_ms() - 120_000)
    node.send(command)
    assert node.result_for(command.actuation_id)[0].status is ActuationStatus.STALE
    admin = AdminClient({"bootstrap.servers": node.settings.bootstrap,
                         **node.settings.kafka_security()})
    group = node.daemon._consumer_config["group.id"]
    description = admin.describe_consumer_groups([group])[group].result(timeout=30)
    assert description.members == []
