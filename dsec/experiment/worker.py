"""One worker of the simulated cluster: PPO on CartPole with the dsec probe and apply
hooks, a SimulatedGpu, the scenario's faults, and a gradient all-reduce over gloo shared
with the other workers of its node group. Rollouts come from an asynchronous sampling
thread that waits at the sampler gate; while it is paused the worker keeps stepping with
its group, contributing nothing to the gradient.

The process starts, imports, then waits for its assignment (one JSON line on stdin), so
a supervisor can keep a warm spare. It appends its timeline to a JSONL file (updates,
episodes, actions applied, resumes, its death) that the experiment measures afterwards.
An OOM on the simulated card, a NaN that reached the weights, and a crash fault end the
process with exit status 1, as they would a real trainer.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist

import dsec
from dsec.actuators.effects import Effect
from dsec.actuators.memory_cap import MemoryCap
from dsec.actuators.restore import NoSnapshotError
from dsec.experiment.arms import ARM_CONFIGS
from dsec.experiment.assignment import Assignment, Timeline
from dsec.experiment.async_checkpoint import AsyncCheckpointer, load_checkpoint
from dsec.experiment.faults import FaultEvent
from dsec.experiment.fleet import WORKLOAD, leak_of
from dsec.experiment.ppo import ActorCritic, PpoConfig, Rollout, build_rollout, ppo_loss
from dsec.experiment.rollout_sampler import RolloutSampler
from dsec.experiment.sim_gpu import GpuSpec, SimulatedGpu, SimulatedOutOfMemoryError
from dsec.experiment.slow_host import SlowHost
from dsec.experiment.worker_faults import ScheduledFaults
from dsec.experiment.worker_group import GroupSync
from dsec.ingest import ProbeConfig
from dsec.ingest.cuda_memory import memory_fields
from dsec.ingest.nvml import NvmlSampler
from dsec.schemas import ActionKind

CRASH_EXIT = 1
GIB = 1 << 30
# The device memory a step of the simulated model holds: the real PPO network is tiny;
# these make it a card's worth.
SIM_BASE_BYTES = int(2.5 * GIB)
SIM_ACTIVATION_BYTES_PER_SAMPLE = 1 << 20
INFERENCE_KERNEL_S = 0.002  # per rollout step (all envs batched)
TRAIN_KERNEL_S = 0.03  # per minibatch (forward + backward + optimizer)
ROLLOUT_WAIT_S = 0.05  # the training thread applies commands between waits for a rollout
# The probe's names for where a worker resumed from (a survivor's weights in memory and an
# asynchronous checkpoint are checkpoints of its own).
RESUME_SOURCES = {"start": "scratch", "snapshot": "snapshot"}
PROBE_CONFIG = ProbeConfig(
    heartbeat_interval_s=2.0, step_sample_every_n_steps=1, grad_norm_every_n_steps=1,
    grad_sync_timing=False, cuda_memory_interval_s=0, gpu_sample_interval_s=0,
)


def termination_reason(state: Any, truncated: bool) -> str | None:
    """Where a CartPole episode ended: which limit, at which cart position (to 10 µm: a
    stuck episode replays the same trajectory exactly, while healthy ones ending within
    the same millimetre three times running happens by chance)."""
    if truncated:
        return None
    x, _, angle, _ = (float(v) for v in state)
    where = ("cart_" + ("left" if x < 0 else "right")) if abs(x) > 2.4 else \
        ("pole_" + ("left" if angle < 0 else "right"))
    return f"{where}_x{x * 1000:+.2f}mm"


def warm_up() -> None:
    """Everything torch imports lazily on first use (the optimizer pulls in dynamo, for
    one), done before the assignment, so a spare takes over in a fraction of a second."""
    torch.set_num_threads(1)
    config = PpoConfig()
    model = ActorCritic(4, 2, config.hidden)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    gym.make("CartPole-v1").reset(seed=0)
    shape = (2, 1)
    rollout = build_rollout(np.zeros((*shape, 4), np.float32), np.zeros(shape, np.int64),
                            np.zeros(shape, np.float32), np.ones(shape, np.float32),
                            np.zeros(shape, np.float32), np.zeros(shape, np.float32),
                            np.zeros(1, np.float32), config)
    scaler = torch.amp.GradScaler("cpu", enabled=True)
    for dtype in (torch.float16, torch.bfloat16):
        with torch.autocast("cpu", dtype=dtype):
            loss = ppo_loss(model, rollout.obs, rollout.actions, rollout.log_probs,
                            rollout.advantages, rollout.returns, config)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    torch.save({"model": model.state_dict()}, io.BytesIO())


class ExperimentWorker:
    """One assigned worker: its model, probe and actuator hooks, faults and group."""

    def __init__(self, a: Assignment, plan: dict[str, Any], assigned_s: float,
                 slow_host: SlowHost | None = None) -> None:
        self.a = a
        self.slow_host = slow_host or SlowHost()
        self.arm = ARM_CONFIGS[a.arm]
        self.scenario = plan["scenario"]
        self.fault_params = self.scenario["faults"]
        born_s = time.time() - a.t0_s
        self.born_s = born_s
        # A fault that struck an earlier incarnation of this worker does not strike it again.
        schedule = [FaultEvent(**{k: e[k] for k in ("kind", "worker", "start_s", "end_s")})
                    for e in plan["schedule"] if e["worker"] == a.slot]
        schedule = [e for e in schedule if e.end_s >= born_s]
        self.timeline = Timeline(a.arm_dir / f"timeline-{a.slot:03d}.jsonl")
        self.timeline.write("start", incarnation=a.incarnation, pid=os.getpid())
        self.rng = np.random.default_rng(a.seed * 7919 + a.slot * 31 + a.incarnation)
        self.faults = ScheduledFaults(schedule, self.fault_params,
                                      lambda: time.time() - a.t0_s, self.rng)

        self.config = PpoConfig()
        torch.manual_seed(1000 * a.seed + a.group)  # a group starts from one set of weights
        self.model = ActorCritic(4, 2, self.config.hidden)
        self.optimizer = torch.optim.Adam(self.model.parameters(),
                                          lr=self.config.learning_rate, eps=1e-5)
        self.params = list(self.model.parameters())
        # A card of the scenario's fleet, as the restarter placed it, or one of its own.
        self.gpu = SimulatedGpu(uuid=a.gpu_uuid, spec=GpuSpec(name=a.gpu_model)) \
            if a.gpu_uuid else SimulatedGpu(uuid=f"GPU-sim-{a.arm}-{a.slot:03d}")
        self.model_leak = leak_of(self.scenario.get("fleet"), a.gpu_model)

        self.startup_s = {"before_init_s": time.time() - assigned_s}
        self.runtime = dsec.init(worker_id=f"worker-{a.slot:03d}", node_id=a.node_id,
                                 job_id=a.job_id, optimizer=self.optimizer,
                                 labels={"workload": WORKLOAD} if a.gpu_uuid else None,
                                 probe_config=PROBE_CONFIG)
        self.startup_s["init_s"] = time.time() - assigned_s
        self.controls = dsec.controls()
        self.controls.memory_cap = MemoryCap(cuda=self.gpu)  # the cap lands on the card
        self.nvml = NvmlSampler(self.runtime.probe, 0.5, nvml=self.gpu).start()
        self.snapshot_dir = a.arm_dir / "snapshots" / f"worker-{a.slot:03d}"
        self.updates = 0
        self.mode = (1, "fp32")  # the group's accumulation window and precision last run
        dsec.enable_snapshots(self.model, self.optimizer, directory=str(self.snapshot_dir),
                              extra_state=lambda: {"updates": self.updates})
        if self.arm.skip_nonfinite_steps:
            dsec.skip_nonfinite_steps(self.optimizer)
        self.opt_steps = self.skipped_steps = 0  # this update's optimizer steps, and skipped
        self.runtime.hooks.observe(self._record_effect)

        self.group = GroupSync(a, self.params, self.optimizer, self.controls,
                               self.runtime.probe, self.faults,
                               self.scenario.get("collective_timeout_s", 20.0))
        self.checkpoint_path = a.arm_dir / f"checkpoint-group-{a.group}.pt"
        self.async_checkpoints = AsyncCheckpointer(
            a.arm_dir / "async-checkpoints" / f"worker-{a.slot:03d}.pt",
            self.scenario["snapshot_interval_s"],
            on_written=lambda updates: self.timeline.write("async_checkpoint",
                                                           updates=updates)) \
            if self.arm.async_checkpoints else None
        # Whether this process holds trained weights an elastic re-formation keeps.
        self.trained_in_memory = False
        self.envs = [gym.make("CartPole-v1") for _ in range(self.config.envs)]
        self.obs = np.stack([env.reset(seed=int(self.rng.integers(1 << 30)))[0]
                             for env in self.envs])
        self.episode_return = np.zeros(self.config.envs)
        self.episode_length = np.zeros(self.config.envs, dtype=np.int64)
        self.generator = torch.Generator().manual_seed(a.seed * 131 + a.slot)
        self.last_checkpoint_s = time.time()
        for p in self.params:
            p.grad = torch.zeros_like(p)
        self.rollouts: RolloutSampler[Rollout] = RolloutSampler(
            self.rollout, self.controls.sampler, self._sampling_failed).start()
        self.startup_s["ready_s"] = time.time() - assigned_s

    def _record_effect(self, kind: ActionKind, _actuation_id: str | None,
                       effect: Effect) -> None:
        self.timeline.write("action", kind=kind.value, status=effect.status.value,
                            detail=effect.detail, requested=effect.requested,
                            in_force=effect.in_force)

    def _sampling_failed(self, exc: BaseException) -> None:
        if isinstance(exc, SimulatedOutOfMemoryError):
            self.die("oom", str(exc))
        self.die("crash", f"sampling thread: {type(exc).__name__}: {exc}")

    def die(self, cause: str, detail: str) -> None:
        self.timeline.write("death", cause=cause, detail=detail[:300])
        if cause == "oom" and self.a.gpu_uuid:
            self._report_oom()
        os._exit(CRASH_EXIT)

    def _report_oom(self) -> None:
        """The allocator's OOM count in a last flush, as a trainer's probe sends it on its
        way out: placement learns which card the worker died on from it."""
        stats = {"allocated_bytes.all.current": self.gpu.live_bytes,
                 "reserved_bytes.all.current": self.gpu.used_bytes, "num_ooms": 1}
        self.runtime.probe.record_fields("cuda_memory", memory_fields(0, stats))
        self.runtime.probe.shutdown()

    def load_resume_point(self) -> tuple[int, str]:
        """The group's resume point: under an elastic launcher, a survivor's weights in
        memory; else the last full checkpoint, or the newer of it and this worker's latest
        asynchronous checkpoint (strong arm) or dsec snapshot (dsec arm)."""
        if self.arm.elastic and self.trained_in_memory:
            return self.updates, "memory"
        ckpt_updates, newer_updates = -1, -1
        ckpt = load_checkpoint(self.checkpoint_path)
        if ckpt is not None:
            ckpt_updates = int(ckpt["updates"])
        newer: tuple[dict, dict | None] | None = None
        source = "checkpoint"
        if self.arm.dsec_snapshots:
            try:
                restored = dsec.restore(str(self.snapshot_dir), None, None, restore_rng=False,
                                        report=False)
                newer_updates = int(restored.meta.get("updates", -1))
                newer, source = (restored.model_state(), restored.optimizer_state()), "snapshot"
            except NoSnapshotError:
                newer = None
        elif self.async_checkpoints is not None:
            staged = load_checkpoint(self.async_checkpoints.path)
            if staged is not None:
                newer_updates = int(staged["updates"])
                newer, source = (staged["model"], staged["optimizer"]), "async_checkpoint"
        if newer_updates > ckpt_updates and newer is not None:
            model_state, optimizer_state = newer
            self.model.load_state_dict(model_state)
            if optimizer_state is not None:
                self.optimizer.load_state_dict(optimizer_state)
            return newer_updates, source
        if ckpt is not None and ckpt_updates >= 0:
            self.model.load_state_dict(ckpt["model"])
            self.optimizer.load_state_dict(ckpt["optimizer"])
            return ckpt_updates, "checkpoint"
        torch.manual_seed(1000 * self.a.seed + self.a.group)
        fresh = ActorCritic(4, 2, self.config.hidden)
        self.model.load_state_dict(fresh.state_dict())
        self.optimizer.state.clear()
        return 0, "start"

    def rollout(self) -> Any:
        with self.slow_host.stretch():
            return self._collect()

    def _collect(self) -> Any:
        steps, n = self.config.rollout_steps, self.config.envs
        b_obs = np.zeros((steps, n, 4), np.float32)
        b_act = np.zeros((steps, n), np.int64)
        b_logp = np.zeros((steps, n), np.float32)
        b_rew = np.zeros((steps, n), np.float32)
        b_val = np.zeros((steps, n), np.float32)
        b_done = np.zeros((steps, n), np.float32)
        stuck = bool(self.faults.active("stuck_episodes"))
        leak = self.faults.active("memory_leak")
        for t in range(steps):
            with torch.no_grad():
                logits, values = self.model(torch.as_tensor(self.obs))
                policy = torch.distributions.Categorical(logits=logits)
                actions = policy.sample()
                log_probs = policy.log_prob(actions)
            self.gpu.run_kernels(INFERENCE_KERNEL_S)
            b_obs[t], b_act[t], b_logp[t], b_val[t] = self.obs, actions, log_probs, values
            for i, env in enumerate(self.envs):
                action = 0 if stuck else int(actions[i])
                next_obs, reward, terminated, truncated, _ = env.step(action)
                self.episode_return[i] += reward
                self.episode_length[i] += 1
                b_rew[t, i] = reward
                if terminated or truncated:
                    b_done[t, i] = 1.0
                    next_obs = self._end_episode(i, env, terminated, truncated, stuck, leak)
                self.obs[i] = next_obs
        with torch.no_grad():
            _, last_values = self.model(torch.as_tensor(self.obs))
        return build_rollout(b_obs, b_act, b_logp, b_rew, b_val, b_done, last_values.numpy(),
                             self.config)

    def _end_episode(self, i: int, env: Any, terminated: bool, truncated: bool,
                     stuck: bool, leak: list[FaultEvent]) -> Any:
        length = int(self.episode_length[i])
        reason = termination_reason(env.unwrapped.state, truncated)
        dsec.report_episode_end(float(self.episode_return[i]), length,
                                terminated=terminated, truncated=truncated,
                                termination_reason=reason, on_training_thread=False)
        self.timeline.write("episode", ret=float(self.episode_return[i]), len=length)
        if leak:
            self._leak(self.fault_params["memory_leak"], length)
        if self.model_leak is not None:
            self._leak(self.model_leak, length)
        self.episode_return[i], self.episode_length[i] = 0.0, 0
        seed = 12345 if stuck else int(self.rng.integers(1 << 30))
        next_obs, _ = env.reset(seed=seed)
        return next_obs

    def _leak(self, params: dict[str, Any], length: int) -> None:
        if length < params["long_episode_steps"]:
            return
        leaked = params["bytes_per_step"] * length
        live = int(leaked * params.get("live_share", 0.0))
        self.gpu.hold(live)
        self.gpu.fragment(leaked - live)

    def train(self, batch: Rollout | None) -> None:
        """One update of the group; ``batch`` None while this worker's sampler is paused:
        it takes every step with the group, contributing nothing to the gradient."""
        # The update's start is a safe point: commands that came during the rollout (where
        # long episodes leave few step boundaries) take effect before its first step.
        dsec.apply_pending()
        config, optimizer = self.config, self.optimizer
        self.opt_steps = self.skipped_steps = 0
        micro = 0  # micro-steps into the current optimizer step's window
        for _epoch in range(config.epochs):
            indices = [None] * config.minibatches if batch is None else \
                batch.minibatches(config.minibatches, self.generator)
            for index in indices:
                if micro == 0:
                    # Every optimizer step starts with the group's agreement, so a command
                    # applied after the last step (a precision downgrade) is in force for
                    # the next one, not one update later.
                    window, dtype = self.group.settings()
                    self.mode = (window, dtype)
                    # the group's window is this worker's in force; the probe then takes
                    # norms per micro-step while it is above 1
                    self.controls.grad_accumulation.run_window(window)
                    scaler = self.group.scaler
                if batch is not None:
                    with self.controls.precision.autocast(dtype):
                        loss = ppo_loss(self.model, batch.obs[index], batch.actions[index],
                                        batch.log_probs[index], batch.advantages[index],
                                        batch.returns[index], config)
                    loss = loss * self.faults.loss_factor() / window
                    scaler.scale(loss).backward()
                    self.gpu.run_kernels(TRAIN_KERNEL_S)
                else:
                    scaler.scale(torch.zeros(()))  # the scaler's state, as the group's
                micro += 1
                if micro < window:
                    continue
                micro = 0
                if not self.group.sync_gradients(contributes=batch is not None):
                    optimizer.zero_grad(set_to_none=False)
                    continue  # no member had data: no step
                scaler.unscale_(optimizer)
                dsec.clip_grad_norm_(self.params, config.max_grad_norm)
                if batch is not None:
                    dsec.report_step(loss.detach() * window)
                taken_before = self._steps_applied()
                scaler.step(optimizer)  # skipped when the gradients are not finite
                self.opt_steps += 1
                self.skipped_steps += self._steps_applied() == taken_before
                scaler.update()
                optimizer.zero_grad(set_to_none=False)
                if not all(bool(torch.isfinite(p).all()) for p in self.params):
                    self.die("nan", "non-finite weights after an optimizer step")
        if micro:  # an unfinished window: its gradients are not carried into the next update
            optimizer.zero_grad(set_to_none=False)

    def _steps_applied(self) -> float:
        """Adam's step count: it does not move on a step that loss scaling or the step
        guard skipped."""
        state = self.optimizer.state[self.params[0]]
        return float(state["step"]) if "step" in state else 0.0

    def _checkpoint_if_due(self) -> None:
        if self.a.rank != 0 or time.time() - self.last_checkpoint_s \
                < self.scenario["checkpoint_interval_s"]:
            return
        tmp = self.checkpoint_path.with_suffix(".tmp")
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "updates": self.updates}, tmp)
        with tmp.open("rb") as handle:
            os.fsync(handle.fileno())
        tmp.replace(self.checkpoint_path)
        self.last_checkpoint_s = time.time()
        self.timeline.write("checkpoint", updates=self.updates)

    def _next_rollout(self) -> Rollout | None:
        """The rollout asked for, or None once the sampling thread is parked at the gate.
        While waiting, the training thread is at a safe point: commands apply here."""
        while time.time() < self.a.end_at_s:
            batch = self.rollouts.take(ROLLOUT_WAIT_S)
            if batch is not None:
                return batch
            self.group.beat()
            dsec.apply_pending()
            if self.rollouts.parked:
                return None
        return None

    def _update(self) -> None:
        t_start, busy_before_s = time.time(), self.gpu.busy_total_s
        if self.faults.crash_due():
            self.die("crash", "injected crash")
        if self.faults.card_failure_due(self.born_s):
            self.die("xid", "injected card failure (flaky card)")
        if self.faults.hang_due():
            self._hang()
            return
        self.gpu.thermal_fault = bool(self.faults.active("thermal_throttle"))
        self.gpu.slowdown = self.faults.slowdown()
        if not self.faults.active("memory_leak") and self.model_leak is None:
            self.gpu.release_held()  # the leak's live tensors go with the fault
        batch = self._next_rollout()
        if batch is None and time.time() >= self.a.end_at_s:
            return  # the run is over: no step the group's members may not all take
        if batch is not None:
            self.gpu.set_working_set(SIM_BASE_BYTES + SIM_ACTIVATION_BYTES_PER_SAMPLE
                                     * batch.obs.shape[0])
        with self.rollouts.weights, self.slow_host.stretch():
            self.train(batch)
        if batch is not None:
            self.rollouts.request()  # the next rollout, with the weights just updated
        self.updates += 1
        self.group.progress.record_update(time.time() - t_start)
        window, dtype = self.mode
        self.timeline.write("update" if batch is not None else "paused_update",
                            updates=self.updates, dur=round(time.time() - t_start, 4),
                            window=window, dtype=dtype,
                            bits=self.controls.grad_compression.bits,
                            opt_steps=self.opt_steps, skipped=self.skipped_steps,
                            busy_s=round(self.gpu.busy_total_s - busy_before_s, 4),
                            mem_gib=round(self.gpu.used_bytes / GIB, 2))
        self.trained_in_memory = True
        self._checkpoint_if_due()
        if self.async_checkpoints is not None and self.async_checkpoints.due():
            self.async_checkpoints.save(self.model, self.optimizer, self.updates)

    def _hang(self) -> None:
        """A silent hang: the training loop stops for good; the process, its heartbeat
        thread and its sockets live on until something kills it or the run ends."""
        self.timeline.write("hang")
        while time.time() < self.a.end_at_s:
            time.sleep(0.2)

    def _train_in_group(self, gen: int) -> int:
        """Trains in generation ``gen`` of the group until the run ends (-1) or a member is
        gone (the generation joined next)."""
        started = time.time()
        try:
            with self.rollouts.weights:  # not while the sampling thread reads them
                updates, source = self.load_resume_point()
                updates = self.group.agree_on_state(updates)
        except Exception as exc:  # a member died while the group formed
            self.timeline.write("group_abort", error=str(exc)[:200])
            self.group.leave(gen)
            return self.group.join()
        self.updates = updates
        self.rollouts.discard()  # collected with the weights before the resume
        self.rollouts.request()
        self.timeline.write("resume", updates=updates, source=source,
                            restore_s=round(time.time() - started, 4), gen=gen)
        if gen > 0 or updates > 0:  # a resume, not the first start of the run
            dsec.report_resume(RESUME_SOURCES.get(source, "checkpoint"),
                               time.time() - started)
        try:
            while time.time() < self.a.end_at_s:
                self._update()
            return -1
        except SimulatedOutOfMemoryError:
            raise
        except RuntimeError as exc:  # a member of the group is gone
            if time.time() >= self.a.end_at_s:
                return -1
            if self.group.timed_out():  # as the NCCL watchdog ends a trainer whose
                self.die("collective_timeout", str(exc))  # collective timed out
            self.timeline.write("group_abort", error=str(exc)[:200])
            self.group.leave(gen)
            return self.group.join()

    def run(self, assigned_s: float) -> None:
        try:
            gen = self.group.join()
            self.timeline.write("joined", **{k: round(v, 3) for k, v in self.startup_s.items()},
                                joined_s=round(time.time() - assigned_s, 3))
            while gen >= 0:
                gen = self._train_in_group(gen)
        except SimulatedOutOfMemoryError as exc:
            self.die("oom", str(exc))
        self.timeline.write("end", updates=self.updates)
        self.rollouts.stop()
        self.nvml.stop()
        dsec.shutdown()
        if dist.is_initialized():
            dist.destroy_process_group()


def main() -> int:
    warm_up()
    if len(sys.argv) > 1:  # the supervisor's ready file: this process can take over now
        Path(sys.argv[1]).touch()
    slow_host = SlowHost(float(sys.argv[2]) if len(sys.argv) > 2 else 1.0)
    line = sys.stdin.readline()
    if not line.strip():
        return 0
    run_assigned(line, slow_host)
    return 0


def run_assigned(line: str, slow_host: SlowHost) -> None:
    """Runs the worker an assignment (one JSON line) describes, until the run ends; then
    ends the process (its threads and the probe's clients are not joined)."""
    assignment = Assignment(**json.loads(line))
    assigned_s = time.time()
    torch.set_num_threads(1)
    plan = json.loads(Path(assignment.scenario_file).read_text())
    ExperimentWorker(assignment, plan, assigned_s, slow_host).run(assigned_s)
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
