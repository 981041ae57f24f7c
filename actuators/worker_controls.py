"""Everything the actuator can change inside one worker, in one place."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dsec.actuators.apply_hooks import ApplyHooks
from dsec.actuators.effects import HookResult
from dsec.actuators.grad_accumulation import GradAccumulation
from dsec.actuators.grad_compression import GradCompression
from dsec.actuators.memory_cap import MemoryCap
from dsec.actuators.precision import AutocastController
from dsec.actuators.sampler import SamplerGate
from dsec.actuators.snapshot_trigger import SnapshotTrigger
from dsec.actuators.sync_priority import CommHook, SyncPriority
from dsec.schemas import ActionKind


def _no_step() -> int:
    return 0


# action kind -> the control that applies it (a field of WorkerControls)
CONTROL_OF: dict[ActionKind, str] = {
    ActionKind.MEMORY_CAP: "memory_cap",
    ActionKind.PRECISION: "precision",
    ActionKind.GRAD_COMPRESSION: "grad_compression",
    ActionKind.GRAD_ACCUMULATION: "grad_accumulation",
    ActionKind.SAMPLER: "sampler",
    ActionKind.SYNC_PRIORITY: "sync_priority",
    ActionKind.SNAPSHOT: "snapshot",
}


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
        """Registers a hook per action kind that applies through the control in place when
        the command comes (a control replaced after this call is the one used)."""
        for kind, name in CONTROL_OF.items():
            hooks.register(kind, self._applier(name))

    def _applier(self, name: str) -> Callable[[Any], HookResult]:
        def apply(params: Any) -> HookResult:
            return getattr(self, name).apply(params)

        return apply

    def comm_hook(self) -> CommHook:
        """The DDP communication hook through which gradient compression and sync
        priority act (what ``dsec.watch_ddp`` registers, timed)."""
        return self.sync_priority.comm_hook(self.grad_compression.comm_hook())

    def state(self) -> dict[str, dict[str, Any]]:
        """Each lasting setting as the worker has it: what the last command requested, what
        the loop runs with (read back where it uses it; None before it has) and the
        worker's own setting, which an undo to ``original`` returns to."""
        return {
            "memory_cap_bytes": self.memory_cap.state(),
            "precision": self.precision.state(),
            "grad_compression_bits": self.grad_compression.state(),
            "grad_accumulation_steps": self.grad_accumulation.state(),
            "sampler_paused": self.sampler.state(),
            "sync_priority": self.sync_priority.state(),
        }

    def in_force(self) -> dict[str, Any]:
        """What the loop runs with, setting by setting."""
        return {name: setting["in_force"] for name, setting in self.state().items()}

    def requested(self) -> dict[str, Any]:
        return {name: setting["requested"] for name, setting in self.state().items()}
