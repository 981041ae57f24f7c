"""What commands do in a program ``dsec run`` instruments, where nothing in the program says.

- ``snapshot``: the parameters and state of every optimizer the program built, and the
  RNG (``optimizers.py``), in ``<snapshot dir>/<worker id>``; unsupported when snapshots
  are off (``DSEC_RUN_SNAPSHOTS=0``, ``dsec run --no-snapshots``);
- ``precision``: the program's autocast regions (``autocast.py``);
- ``memory_cap``: as with ``dsec.init`` (the runtime's own applier);
- the rest need the program's help: unsupported, naming the line that adds it. Gradient
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

SNAPSHOTS_ENV = "DSEC_RUN_SNAPSHOTS"  # "0": snapshot commands are unsupported
# "1": every optimizer step whose gradients are not finite is skipped (the step guard)
SKIP_NONFINITE_ENV = "DSEC_RUN_SKIP_NONFINITE_STEPS"
# kind -> (why dsec run cannot carry it out, the line that would)
NEEDS_CODE = {
    "grad_compression": ("one DDP rank compressing alone would leave the others waiting",
                         "attach it on every rank: "
                         "`dsec.controls().grad_compression.attach(ddp_model)`"),
    "grad_accumulation": ("the program decides when it steps",
                          "add `with dsec.controls().grad_accumulation.micro_step(model) "
                          "as sync:` around each backward"),
    "sampler": ("the program's sampling loop does not wait on dsec",
                "call `dsec.controls().sampler.wait_until_running()` before each batch"),
    "sync_priority": ("the program's gradient average does not read it",
                      "use `dsec.watch_ddp(model)`"),
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
        for kind, (reason, line) in NEEDS_CODE.items():
            runtime.on_action(kind, _needs_code(kind, reason, line))

    def snapshot(self, params: Any) -> Any:
        """A detail (applied) or the trigger's Effect where it cannot start one."""
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
        result = trigger.apply(params)
        if not isinstance(result, str):
            return result
        return f"{result}: parameters and state of {len(self._optimizers.live())} optimizer(s)"


def _needs_code(kind: str, reason: str, line: str) -> Callable[[Any], Any]:
    def apply(_params: Any) -> Any:
        from dsec.actuators.effects import Effect

        return Effect.unsupported(kind, f"under dsec run {reason}", line)

    return apply
