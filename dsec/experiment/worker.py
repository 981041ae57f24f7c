"""One worker of the simulated cluster: PPO on CartPole with the dsec probe and apply
hooks, a SimulatedGpu, the scenario's faults, and a gradient all-reduce over gloo shared
with the other workers of its node group.

The process starts, imports, then waits for its assignment (one JSON line on stdin), so
a supervisor can keep a warm spare. It appends its timeline to a JSONL file (updates,
episodes, actions applied, resumes, its death) that the experiment measures afterwards.
An OOM on the simulated card, a NaN that reached the weights, and a crash fault end the
process with exit status 1, as they would a real trainer.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

CRASH_EXIT = 1
GIB = 1 << 30
# The simulated model: what the gradient sync puts on the wire per step (fp32), and the
# device memory a step holds. The real PPO network is tiny; these make it a card's worth.
SIM_GRAD_PARAMS = 2_500_000
SIM_BASE_BYTES = int(2.5 * GIB)
SIM_ACTIVATION_BYTES_PER_SAMPLE = 1 << 20
HEALTHY_LINK_BYTES_PER_S = 2e9
INFERENCE_KERNEL_S = 0.002  # per rollout step (all envs batched)
TRAIN_KERNEL_S = 0.03  # per minibatch (forward + backward + optimizer)


@dataclass(frozen=True)
class Assignment:
    arm: str  # "baseline" | "dsec"
    slot: int
    group: int
    rank: int
    group_size: int
    node_id: str
    store_port: int
    run_dir: str
    scenario_file: str  # JSON: {"scenario": ..., "schedule": [...]}
    t0: float  # epoch seconds of the run's start (fault times are relative to it)
    end_at: float  # epoch seconds
    seed: int
    incarnation: int
    job_id: str

    @property
    def arm_dir(self) -> Path:
        return Path(self.run_dir) / self.arm


class Timeline:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = path.open("a", buffering=1)

    def write(self, event: str, **fields: Any) -> None:
        self._handle.write(json.dumps({"e": event, "t": round(time.time(), 4), **fields}) + "\n")


def wire_bytes(bits: int) -> int:
    return SIM_GRAD_PARAMS * (4 if bits >= 32 else 2 if bits == 16 else 1) if bits >= 8 \
        else SIM_GRAD_PARAMS * bits // 8


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


def _warm_up(torch: Any, gym: Any, actor_critic: Any, ppo_config: Any, build_rollout: Any,
             ppo_loss: Any) -> None:
    """Everything torch imports lazily on first use (the optimizer pulls in dynamo, for
    one), done before the assignment, so a spare takes over in a fraction of a second."""
    import numpy as np

    torch.set_num_threads(1)
    config = ppo_config()
    model = actor_critic(4, 2, config.hidden)
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
    torch.save({"model": model.state_dict()}, __import__("io").BytesIO())


def main() -> int:
    import gymnasium as gym
    import numpy as np
    import torch
    import torch.distributed as dist

    import dsec
    from dsec.actuators.grad_compression import dequantise_gradient, quantise_gradient
    from dsec.actuators.memory_cap import MemoryCap
    from dsec.actuators.restore import NoSnapshotError
    from dsec.experiment.faults import FaultEvent
    from dsec.experiment.ppo import ActorCritic, PpoConfig, build_rollout, ppo_loss
    from dsec.experiment.sim_gpu import SimulatedGpu, SimulatedOutOfMemoryError
    from dsec.ingest import ProbeConfig
    from dsec.ingest.nvml import NvmlSampler
    from dsec.schemas import ActionKind

    _warm_up(torch, gym, ActorCritic, PpoConfig, build_rollout, ppo_loss)
    if len(sys.argv) > 1:  # the supervisor's ready file: this process can take over now
        Path(sys.argv[1]).touch()
    line = sys.stdin.readline()
    if not line.strip():
        return 0
    a = Assignment(**json.loads(line))
    assigned_s = time.time()
    torch.set_num_threads(1)
    plan = json.loads(Path(a.scenario_file).read_text())
    faults = plan["scenario"]["faults"]
    schedule = [FaultEvent(**{k: e[k] for k in ("kind", "worker", "start_s", "end_s")})
                for e in plan["schedule"] if e["worker"] == a.slot]
    timeline = Timeline(a.arm_dir / f"timeline-{a.slot:03d}.jsonl")
    timeline.write("start", incarnation=a.incarnation, pid=os.getpid())
    # A fault that struck an earlier incarnation of this worker does not strike it again.
    born_s = time.time() - a.t0
    schedule = [e for e in schedule if e.end_s >= born_s]

    config = PpoConfig()
    torch.manual_seed(1000 * a.seed + a.group)  # a group starts from one set of weights
    model = ActorCritic(4, 2, config.hidden)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.learning_rate, eps=1e-5)
    params = list(model.parameters())
    gpu = SimulatedGpu(uuid=f"GPU-sim-{a.arm}-{a.slot:03d}")

    before_init_s = time.time() - assigned_s
    runtime = dsec.init(worker_id=f"worker-{a.slot:03d}", node_id=a.node_id, job_id=a.job_id,
                        optimizer=optimizer, probe_config=ProbeConfig(
                            heartbeat_interval_s=2.0, step_sample_every_n_steps=1,
                            grad_norm_every_n_steps=1, grad_sync_timing=False,
                            cuda_memory_interval_s=0, gpu_sample_interval_s=0))
    init_s = time.time() - assigned_s
    controls = dsec.controls()
    controls.memory_cap = MemoryCap(cuda=gpu)  # the cap lands on the simulated card
    sampler = NvmlSampler(runtime.probe, 0.5, nvml=gpu).start()
    snapshot_dir = a.arm_dir / "snapshots" / f"worker-{a.slot:03d}"
    state = {"updates": 0}
    dsec.enable_snapshots(model, optimizer, directory=str(snapshot_dir),
                          extra_state=lambda: {"updates": state["updates"]})

    def recorded(kind: ActionKind, apply: Any) -> Any:
        def hook(params_: Any) -> str:
            detail = apply(params_) or ""
            timeline.write("action", kind=kind.value, detail=detail)
            return detail
        return hook

    for kind, apply in {
        ActionKind.MEMORY_CAP: controls.memory_cap.apply,
        ActionKind.PRECISION: controls.precision.apply,
        ActionKind.GRAD_COMPRESSION: controls.grad_compression.apply,
        ActionKind.GRAD_ACCUMULATION: controls.grad_accumulation.apply,
        ActionKind.SAMPLER: controls.sampler.apply,
        ActionKind.SYNC_PRIORITY: controls.sync_priority.apply,
        ActionKind.SNAPSHOT: controls.snapshot.apply,
    }.items():
        runtime.on_action(kind, recorded(kind, apply))

    store = dist.TCPStore("127.0.0.1", a.store_port, is_master=False,
                          timeout=timedelta(seconds=60))
    gen_key = f"{a.arm}/group-{a.group}/gen"
    checkpoint_path = a.arm_dir / f"checkpoint-group-{a.group}.pt"
    scenario = plan["scenario"]
    used_stalls: set[float] = set()
    nan_left: dict[float, int] = {}

    def die(cause: str, detail: str) -> None:
        timeline.write("death", cause=cause, detail=detail[:300])
        os._exit(CRASH_EXIT)

    def now_s() -> float:
        return time.time() - a.t0

    def active(kind: str) -> list[FaultEvent]:
        t = now_s()
        return [e for e in schedule if e.kind == kind and e.active(t)]

    def join_group() -> int:
        while True:
            if time.time() > a.end_at:
                return -1
            gen = int(store.get(gen_key))
            try:
                dist.init_process_group(
                    "gloo", store=dist.PrefixStore(f"{a.arm}/group-{a.group}/{gen}/", store),
                    rank=a.rank, world_size=a.group_size, timeout=timedelta(seconds=20))
                return gen
            except Exception:
                if dist.is_initialized():
                    dist.destroy_process_group()
                time.sleep(0.2)

    def leave_group(gen: int) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        while int(store.get(gen_key)) == gen and time.time() < a.end_at:
            time.sleep(0.05)

    def load_resume_point() -> tuple[int, str]:
        """The group's resume point: the last full checkpoint; in the dsec arm, the newer
        of it and this worker's latest dsec snapshot."""
        ckpt_updates, snap_updates = -1, -1
        if checkpoint_path.exists():
            ckpt = torch.load(checkpoint_path, weights_only=False)
            ckpt_updates = int(ckpt["updates"])
        restored = None
        if a.arm == "dsec":
            try:
                restored = dsec.restore(str(snapshot_dir), None, None, restore_rng=False)
                snap_updates = int(restored.meta.get("updates", -1))
            except NoSnapshotError:
                restored = None
        if snap_updates > ckpt_updates and restored is not None:
            model.load_state_dict(restored.model_state())
            optimizer_state = restored.optimizer_state()
            if optimizer_state is not None:
                optimizer.load_state_dict(optimizer_state)
            return snap_updates, "snapshot"
        if ckpt_updates >= 0:
            model.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
            return ckpt_updates, "checkpoint"
        torch.manual_seed(1000 * a.seed + a.group)
        fresh = ActorCritic(4, 2, config.hidden)
        model.load_state_dict(fresh.state_dict())
        optimizer.state.clear()
        return 0, "start"

    def adam_tensors() -> list[torch.Tensor]:
        out = []
        for p in params:
            s = optimizer.state[p]
            if not s:
                s.update(step=torch.zeros(()), exp_avg=torch.zeros_like(p),
                         exp_avg_sq=torch.zeros_like(p))
            out += [p.data, s["exp_avg"], s["exp_avg_sq"], s["step"].reshape(1)]
        return out

    def agree_on_state(updates: int) -> int:
        """The group resumes from the freshest resume point any member holds."""
        counts = [torch.zeros(1, dtype=torch.int64) for _ in range(a.group_size)]
        dist.all_gather(counts, torch.tensor([updates], dtype=torch.int64))
        values = [int(c.item()) for c in counts]
        source = values.index(max(values))
        tensors = adam_tensors()
        flat = torch.cat([t.reshape(-1).float() for t in tensors])
        dist.broadcast(flat, src=source)
        offset = 0
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset:offset + n].reshape(t.shape))
            offset += n
        return max(values)

    def link_seconds(bits: int) -> float:
        jitter = active("sync_jitter")
        seconds = wire_bytes(bits) / HEALTHY_LINK_BYTES_PER_S
        if jitter:
            seconds = wire_bytes(bits) / faults["sync_jitter"]["degraded_bytes_per_s"]
            seconds += abs(np.random.normal(0.0, faults["sync_jitter"]["jitter_ms"])) / 1000.0
        for stall in active("sync_stall"):
            if stall.start_s not in used_stalls:
                used_stalls.add(stall.start_s)
                seconds += stall.end_s - stall.start_s
        return seconds

    def sync_gradients() -> None:
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        bits = controls.grad_compression.bits
        if bits < 32:
            codes, scale = quantise_gradient(flat, bits)
            flat = dequantise_gradient(codes, scale, bits, flat.numel()).float()
        # The sync is timed as this worker's simulated link costs it: the transfer at its
        # simulated length (jitter and stalls included). Left out, because on the test
        # machine (16 trainers on 2 cores) they measure the CPU scheduler and not a link:
        # how long the sleep that stands for the transfer overruns, the barrier's wait for a
        # peer (that peer's slow link is its own to report), and the loopback all-reduce of
        # the real, tiny gradient (20 ms at the median and 90-140 ms at p95 on a quiet run,
        # over a simulated 5 ms link), which wait for the other process to be scheduled.
        link_s = link_seconds(bits)
        time.sleep(link_s)
        dist.barrier()
        dist.all_reduce(flat)
        latency_ms = link_s * 1000.0
        runtime.probe.record_grad_sync(runtime.probe.global_step, wire_bytes(bits),
                                       latency_ms, True, "all_reduce")
        flat /= a.group_size
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[offset:offset + n].reshape(p.shape))
            offset += n

    envs = [gym.make("CartPole-v1") for _ in range(config.envs)]
    rng = np.random.default_rng(a.seed * 7919 + a.slot * 31 + a.incarnation)
    obs = np.stack([env.reset(seed=int(rng.integers(1 << 30)))[0] for env in envs])
    episode_return = np.zeros(config.envs)
    episode_length = np.zeros(config.envs, dtype=np.int64)
    generator = torch.Generator().manual_seed(a.seed * 131 + a.slot)
    last_checkpoint_s = time.time()

    def rollout() -> Any:
        nonlocal obs
        steps, n = config.rollout_steps, config.envs
        b_obs = np.zeros((steps, n, 4), np.float32)
        b_act = np.zeros((steps, n), np.int64)
        b_logp = np.zeros((steps, n), np.float32)
        b_rew = np.zeros((steps, n), np.float32)
        b_val = np.zeros((steps, n), np.float32)
        b_done = np.zeros((steps, n), np.float32)
        stuck = bool(active("stuck_episodes"))
        leak = active("memory_leak")
        for t in range(steps):
            with torch.no_grad():
                logits, values = model(torch.as_tensor(obs))
                dist_ = torch.distributions.Categorical(logits=logits)
                actions = dist_.sample()
                log_probs = dist_.log_prob(actions)
            gpu.run_kernels(INFERENCE_KERNEL_S)
            b_obs[t], b_act[t], b_logp[t], b_val[t] = obs, actions, log_probs, values
            for i, env in enumerate(envs):
                action = 0 if stuck else int(actions[i])
                next_obs, reward, terminated, truncated, _ = env.step(action)
                episode_return[i] += reward
                episode_length[i] += 1
                b_rew[t, i] = reward
                if terminated or truncated:
                    b_done[t, i] = 1.0
                    length = int(episode_length[i])
                    reason = termination_reason(env.unwrapped.state, truncated)
                    dsec.report_episode_end(float(episode_return[i]), length,
                                            terminated=terminated, truncated=truncated,
                                            termination_reason=reason)
                    timeline.write("episode", ret=float(episode_return[i]), len=length)
                    if leak and length >= faults["memory_leak"]["long_episode_steps"]:
                        gpu.fragment(faults["memory_leak"]["bytes_per_step"] * length)
                    episode_return[i], episode_length[i] = 0.0, 0
                    seed = 12345 if stuck else int(rng.integers(1 << 30))
                    next_obs, _ = env.reset(seed=seed)
                obs[i] = next_obs
        with torch.no_grad():
            _, last_values = model(torch.as_tensor(obs))
        return build_rollout(b_obs, b_act, b_logp, b_rew, b_val, b_done, last_values.numpy(),
                             config)

    def loss_factor() -> float:
        t = now_s()
        for event in schedule:
            if event.kind != "nan_burst":
                continue
            if event.start_s <= t < event.end_s:  # precursor: gradient-norm spikes
                return faults["nan_burst"]["spike_factor"] if rng.random() < 0.5 else 1.0
            if t >= event.end_s:
                left = nan_left.setdefault(event.start_s, faults["nan_burst"]["burst_steps"])
                if left > 0:
                    nan_left[event.start_s] = left - 1
                    return math.nan
        return 1.0

    precision_codes = ("fp32", "bf16", "fp16")
    group_precision: dict[str, Any] = {"dtype": "fp32", "scaler": None}

    def group_settings() -> tuple[int, str]:
        """Accumulation and precision are properties of a data-parallel group, not of one
        member: the group runs the longest window and the most protective precision (fp16
        with loss scaling) any member was switched to, and every member's GradScaler then
        sees the same synchronised gradients and keeps the same scale."""
        control = torch.tensor([controls.grad_accumulation.steps,
                                precision_codes.index(controls.precision.dtype)])
        dist.all_reduce(control, op=dist.ReduceOp.MAX)
        dtype = precision_codes[int(control[1])]
        if dtype != group_precision["dtype"] or group_precision["scaler"] is None:
            group_precision["dtype"] = dtype
            group_precision["scaler"] = torch.amp.GradScaler("cpu", enabled=dtype == "fp16")
        return int(control[0]), dtype

    def train(batch: Any) -> None:
        # The update's start is a safe point: commands that came during the rollout (where
        # long episodes leave few step boundaries) take effect before its first step.
        dsec.apply_pending()
        micro = 0  # micro-steps into the current optimizer step's window
        for _epoch in range(config.epochs):
            for index in batch.minibatches(config.minibatches, generator):
                if micro == 0:
                    # Every optimizer step starts with the group's agreement, so a command
                    # applied after the last step (a precision downgrade) is in force for
                    # the next one, not one update later.
                    window, dtype = group_settings()
                    dsec.note_accumulation(window)  # norms per micro-step while accumulating
                    scaler = group_precision["scaler"]
                autocast_dtype = torch.float16 if dtype == "fp16" else torch.bfloat16
                with torch.autocast("cpu", dtype=autocast_dtype, enabled=dtype != "fp32"):
                    loss = ppo_loss(model, batch.obs[index], batch.actions[index],
                                    batch.log_probs[index], batch.advantages[index],
                                    batch.returns[index], config)
                loss = loss * loss_factor() / window
                scaler.scale(loss).backward()
                micro += 1
                gpu.run_kernels(TRAIN_KERNEL_S)
                if micro < window:
                    continue
                micro = 0
                sync_gradients()
                scaler.unscale_(optimizer)
                dsec.clip_grad_norm_(params, config.max_grad_norm)
                dsec.report_step(loss.detach() * window)
                scaler.step(optimizer)  # skipped when the gradients are not finite
                scaler.update()
                optimizer.zero_grad(set_to_none=False)
                if not all(bool(torch.isfinite(p).all()) for p in params):
                    die("nan", "non-finite weights after an optimizer step")
        if micro:  # an unfinished window: its gradients are not carried into the next update
            optimizer.zero_grad(set_to_none=False)

    for p in params:
        p.grad = torch.zeros_like(p)
    ready_s = time.time() - assigned_s
    try:
        gen = join_group()
        timeline.write("joined", before_init_s=round(before_init_s, 3),
                       init_s=round(init_s, 3), ready_s=round(ready_s, 3),
                       joined_s=round(time.time() - assigned_s, 3))
        while gen >= 0:
            started = time.time()
            updates, source = load_resume_point()
            try:
                updates = agree_on_state(updates)
            except Exception as exc:  # a member died while the group formed
                timeline.write("group_abort", error=str(exc)[:200])
                leave_group(gen)
                gen = join_group()
                continue
            state["updates"] = updates
            timeline.write("resume", updates=updates, source=source,
                           restore_s=round(time.time() - started, 4), gen=gen)
            try:
                while time.time() < a.end_at:
                    t_start, busy_before_s = time.time(), gpu.busy_total_s
                    if any(e.kind == "crash" and e.start_s <= now_s() for e in schedule):
                        die("crash", "injected crash")
                    gpu.thermal_fault = bool(active("thermal_throttle"))
                    batch = rollout()
                    gpu.set_working_set(SIM_BASE_BYTES + SIM_ACTIVATION_BYTES_PER_SAMPLE
                                        * batch.obs.shape[0])
                    train(batch)
                    state["updates"] += 1
                    timeline.write("update", updates=state["updates"],
                                   dur=round(time.time() - t_start, 4),
                                   busy_s=round(gpu.busy_total_s - busy_before_s, 4),
                                   mem_gib=round(gpu.used_bytes / GIB, 2))
                    if a.rank == 0 and time.time() - last_checkpoint_s \
                            >= scenario["checkpoint_interval_s"]:
                        tmp = checkpoint_path.with_suffix(".tmp")
                        torch.save({"model": model.state_dict(),
                                    "optimizer": optimizer.state_dict(),
                                    "updates": state["updates"]}, tmp)
                        with tmp.open("rb") as handle:
                            os.fsync(handle.fileno())
                        tmp.replace(checkpoint_path)
                        last_checkpoint_s = time.time()
                        timeline.write("checkpoint", updates=state["updates"])
                break
            except SimulatedOutOfMemoryError:
                raise
            except RuntimeError as exc:  # a member of the group is gone
                if time.time() >= a.end_at:
                    break
                timeline.write("group_abort", error=str(exc)[:200])
                leave_group(gen)
                gen = join_group()
    except SimulatedOutOfMemoryError as exc:
        die("oom", str(exc))
    timeline.write("end", updates=state["updates"])
    sampler.stop()
    dsec.shutdown()
    if dist.is_initialized():
        dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
