"""Everything the actuator can change inside one worker, in one place."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dsec.actuators.apply_hooks import ApplyHooks
from dsec.actuators.grad_accumulation import GradAccumulation
from dsec.actuators.grad_compression import GradCompression
from dsec.actuators.memory_cap import MemoryCap
from dsec.actuators.precision import AutocastController
from dsec.actuators.sampler import SamplerGate
from dsec.actuators.snapshot_trigger import SnapshotTrigger
from dsec.actuators.sync_priority import SyncPriority
from dsec.schemas import ActionKind


def _no_step() -> int:
    return 0


@dataclass
class WorkerControls:
    memory_cap: MemoryCap = field(default_factory=MemoryCap)
    precision: AutocastController = field(default_factory=AutocastController)
    grad_compression: GradCompression = field(default_factory=GradCompression)
    grad_accumulation: GradAccumulation = field(default_factory=GradAccumulation)
    sampler: SamplerGate = field(default_factory=SamplerGate)
    sync_priority: SyncPriority = field(default_factory=SyncPriority)
    snapshot: SnapshotTrigger = field(default_factory=lambda: SnapshotTrigger(_no_step))

    def register(self, hooks: ApplyHooks) -> None:
        appliers: dict[ActionKind, Callable[[Any], str]] = {
            ActionKind.MEMORY_CAP: self.memory_cap.apply,
            ActionKind.PRECISION: self.precision.apply,
            ActionKind.GRAD_COMPRESSION: self.grad_compression.apply,
            ActionKind.GRAD_ACCUMULATION: self.grad_accumulation.apply,
            ActionKind.SAMPLER: self.sampler.apply,
            ActionKind.SYNC_PRIORITY: self.sync_priority.apply,
            ActionKind.SNAPSHOT: self.snapshot.apply,
        }
        for kind, apply in appliers.items():
            hooks.register(kind, apply)

    def state(self) -> dict[str, Any]:
        """The worker's actual settings, as the actuator would describe them."""
        return {
            "memory_cap_bytes": self.memory_cap.limit_bytes,
            "precision": self.precision.dtype,
            "grad_compression_bits": self.grad_compression.bits,
            "grad_accumulation_steps": self.grad_accumulation.steps,
            "sampler_paused": self.sampler.paused,
            "sync_priority": self.sync_priority.level,
        }
