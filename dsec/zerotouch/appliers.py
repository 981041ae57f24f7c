"""What commands do in a program ``dsec run`` instruments, where nothing in the program says.

- ``snapshot``: the parameters and state of every optimizer the program built, and the
  RNG (``optimizers.py``), in ``<snapshot dir>/<worker id>``; refused when snapshots are
  off (``DSEC_RUN_SNAPSHOTS=0``, ``dsec run --no-snapshots``);
- ``precision``: the program's autocast regions (``autocast.py``);
- ``memory_cap``: as with ``dsec.init`` (the runtime's own applier);
- the rest need the program's help: refused, naming the line that adds it. Gradient
  compression among them: a command reaches one worker, and under DDP one rank changing
  its collectives alone leaves the others waiting on it, so only a program that decided
  on compression (``dsec.controls().grad_compression.attach(ddp_model)``) gets it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dsec.zerotouch.autocast import AutocastOverride
from dsec.zerotouch.identity import safe_id
from dsec.zerotouch.optimizers import OptimizerParams, OptimizerRegistry, Optimizers

SNAPSHOTS_ENV = "DSEC_RUN_SNAPSHOTS"  # "0": snapshot commands are refused
NEEDS_CODE = {
    "grad_compression": "`dsec.controls().grad_compression.attach(ddp_model)`, on every "
                        "rank (one rank compressing alone would leave the others waiting)",
    "grad_accumulation": "`with dsec.controls().grad_accumulation.micro_step(model) as sync:` "
                         "around each backward",
    "sampler": "`dsec.controls().sampler.wait_until_running()` in the sampling loop",
    "sync_priority": "`dsec.controls().sync_priority.level` read by the loop's communication",
}


class ZeroTouchAppliers:
    def __init__(self, optimizers: OptimizerRegistry, autocast: AutocastOverride) -> None:
        self._optimizers = optimizers
        self._autocast = autocast

    def register(self, runtime: Any, env: Mapping[str, str]) -> None:
        from dsec.schemas import ActionKind

        self._runtime = runtime
        if env.get(SNAPSHOTS_ENV, "1") != "0":
            runtime.on_action(ActionKind.SNAPSHOT, self.snapshot)
        runtime.on_action(ActionKind.PRECISION, self._autocast.apply)
        for kind, line in NEEDS_CODE.items():
            runtime.on_action(kind, _needs_code(kind, line))

    def snapshot(self, params: Any) -> str:
        trigger = self._runtime.controls.snapshot
        if trigger.snapshotter is None:
            from dsec.actuators.snapshotter import SnapshotConfig, Snapshotter

            optimizers = self._optimizers.live()
            if not optimizers:
                raise RuntimeError("no optimizer built yet: nothing to snapshot")
            directory = (Path(self._runtime.settings.snapshot_location())
                         / safe_id(self._runtime.identity.worker_id).replace("/", "_"))
            trigger.attach(Snapshotter(OptimizerParams(optimizers), Optimizers(optimizers),
                                       SnapshotConfig(directory=directory)))
        detail = trigger.apply(params)
        return f"{detail}: parameters and state of {len(self._optimizers.live())} optimizer(s)"


def _needs_code(kind: str, line: str) -> Callable[[Any], str]:
    def apply(_params: Any) -> str:
        raise RuntimeError(f"{kind} needs code under dsec run: {line}")

    return apply
