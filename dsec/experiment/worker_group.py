"""The data-parallel group of an experiment worker: joining it, agreeing on state and
settings, and the gradient all-reduce over gloo."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from dsec.actuators.grad_compression import dequantise_gradient, quantise_gradient
from dsec.experiment.assignment import Assignment
from dsec.experiment.progress import ProgressBeat
from dsec.experiment.worker_faults import ScheduledFaults, wire_bytes
from dsec.schemas.units import duration_ms

PRECISION_CODES = ("fp32", "bf16", "fp16")


class GroupSync:
    def __init__(self, assignment: Assignment, params: list[torch.Tensor],
                 optimizer: torch.optim.Optimizer, controls: Any, probe: Any,
                 faults: ScheduledFaults, collective_timeout_s: float = 20.0) -> None:
        self._a = assignment
        self.collective_timeout_s = collective_timeout_s
        self._collective_timeout = timedelta(seconds=collective_timeout_s)
        self.progress = ProgressBeat(assignment.arm_dir / "beats" / f"worker-{assignment.slot:03d}")
        self.last_beat_s = time.time()
        self._params = params
        self._optimizer = optimizer
        self._controls = controls
        self._probe = probe
        self._faults = faults
        self._store = dist.TCPStore("127.0.0.1", assignment.store_port, is_master=False,
                                    timeout=timedelta(seconds=60))
        self._gen_key = f"{assignment.arm}/group-{assignment.group}/gen"
        self._dtype = "fp32"
        self.scaler: Any = None
        # Every update takes all four (``settings`` and ``sync_gradients``): a command that
        # comes before the first one, as the node's desired state does to a worker that
        # restarted, is carried out by it.
        for setting in (controls.precision, controls.grad_accumulation,
                        controls.grad_compression, controls.sync_priority):
            setting.mark_attached()

    def join(self) -> int:
        """Joins the group's current generation; -1 once the run is over."""
        a = self._a
        while True:
            self.beat()
            if time.time() > a.end_at_s:
                return -1
            gen = int(self._store.get(self._gen_key))
            if not self._await_peers(gen):
                continue  # the generation moved on, or the run ended, while waiting
            try:
                dist.init_process_group(
                    "gloo",
                    store=dist.PrefixStore(f"{a.arm}/group-{a.group}/{gen}/", self._store),
                    rank=a.rank, world_size=a.group_size, timeout=self._collective_timeout)
                return gen
            except Exception:
                if dist.is_initialized():
                    dist.destroy_process_group()
                time.sleep(0.2)

    def _await_peers(self, gen: int) -> bool:
        """Waits, beating, until every rank has arrived at generation ``gen`` (as
        torchelastic's rendezvous comes before the process group): a member waiting for
        a replacement to start is not hung, and the launcher's watchdog sees it beat.
        False if the generation moved on or the run ended first."""
        a = self._a
        prefix = f"{a.arm}/group-{a.group}/arrived/{gen}/"
        self._store.set(f"{prefix}{a.rank}", "1")
        ranks = [f"{prefix}{rank}" for rank in range(a.group_size)]
        while not self._store.check(ranks):
            if time.time() > a.end_at_s or int(self._store.get(self._gen_key)) != gen:
                return False
            self.beat()
            time.sleep(0.05)
        return True

    def leave(self, gen: int) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        while int(self._store.get(self._gen_key)) == gen and time.time() < self._a.end_at_s:
            self.beat()
            time.sleep(0.05)

    def beat(self) -> None:
        """The training loop is making progress (entering a collective, re-forming)."""
        self.last_beat_s = time.time()
        self.progress.beat()

    def timed_out(self) -> bool:
        """Whether the collective that just failed waited out its timeout (a peer that
        stopped stepping) rather than losing its peer (a dead process)."""
        return time.time() - self.last_beat_s >= 0.9 * self.collective_timeout_s

    def _adam_tensors(self) -> list[torch.Tensor]:
        out = []
        for p in self._params:
            s = self._optimizer.state[p]
            if not s:
                s.update(step=torch.zeros(()), exp_avg=torch.zeros_like(p),
                         exp_avg_sq=torch.zeros_like(p))
            out += [p.data, s["exp_avg"], s["exp_avg_sq"], s["step"].reshape(1)]
        return out

    def agree_on_state(self, updates: int) -> int:
        """The group resumes from the freshest resume point any member holds."""
        counts = [torch.zeros(1, dtype=torch.int64) for _ in range(self._a.group_size)]
        dist.all_gather(counts, torch.tensor([updates], dtype=torch.int64))
        values = [int(c.item()) for c in counts]
        source = values.index(max(values))
        tensors = self._adam_tensors()
        flat = torch.cat([t.reshape(-1).float() for t in tensors])
        dist.broadcast(flat, src=source)
        offset = 0
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset:offset + n].reshape(t.shape))
            offset += n
        return max(values)

    def settings(self) -> tuple[int, str]:
        """Accumulation and precision are properties of a data-parallel group, not of one
        member: the group runs the longest window and the most protective precision (fp16
        with loss scaling) any member was switched to, and every member's GradScaler then
        sees the same synchronised gradients and keeps the same scale."""
        controls = self._controls
        self.beat()
        # what this member was asked for, not what the group ran last
        control = torch.tensor([controls.grad_accumulation.requested,
                                PRECISION_CODES.index(controls.precision.requested)])
        dist.all_reduce(control, op=dist.ReduceOp.MAX)
        dtype = PRECISION_CODES[int(control[1])]
        if dtype != self._dtype or self.scaler is None:
            self._dtype = dtype
            self.scaler = torch.amp.GradScaler("cpu", enabled=dtype == "fp16")
        return int(control[0]), dtype

    def sync_gradients(self, contributes: bool = True) -> bool:
        """The group's weighted average of its members' gradients into this worker's: a
        member weighs in at 2**(its sync priority), one without data (its sampler
        paused) at 0. False, and nothing changed, when no member contributed."""
        self.beat()
        flat = torch.cat([p.grad.reshape(-1) for p in self._params])
        compression = self._controls.grad_compression
        bits = compression.take(compression.bits)
        if bits < 32:
            codes, scale = quantise_gradient(flat, bits)
            flat = dequantise_gradient(codes, scale, bits, flat.numel()).float()
        weight = self._controls.sync_priority.weight() if contributes else 0.0
        # The sync is timed as this worker's simulated link costs it: the transfer at its
        # simulated length (jitter and stalls included). Left out, because 16 trainers on
        # 2 cores measure the CPU scheduler and not a link: how long the sleep that stands
        # for the transfer overruns, the barrier's wait for a peer (that peer's slow link
        # is its own to report), and the loopback all-reduce of the real, tiny gradient,
        # which waits for the other process to be scheduled.
        link_s = self._faults.link_s(bits)
        time.sleep(link_s)
        dist.barrier()
        weighted = torch.cat([flat * weight, flat.new_tensor([weight])])  # and the weight
        dist.all_reduce(weighted)
        self._probe.record_grad_sync(self._probe.global_step, wire_bytes(bits),
                                     duration_ms(link_s), True, "all_reduce")
        total_weight = float(weighted[-1])
        if total_weight == 0.0:
            return False
        flat = weighted[:-1] / total_weight
        offset = 0
        for p in self._params:
            n = p.numel()
            p.grad.copy_(flat[offset:offset + n].reshape(p.shape))
            offset += n
        return True
