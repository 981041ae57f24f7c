"""dsec: a training-health coordinator for large-scale RL training.

Three lines in a training script::

    dsec.init(bootstrap="127.0.0.1:9092", worker_id="w0", optimizer=opt)
    dsec.report_episode_end(reward, length)
    dsec.shutdown()

and, for the actions that change the loop: ``with dsec.autocast():`` around the
forward pass, ``dsec.controls()`` for the rest, ``dsec.enable_snapshots(model, opt)``
and ``dsec.restore(location, model, opt)``; ``dsec.skip_nonfinite_steps(opt)`` keeps a NaN
step off the weights.
Or ``env = dsec.wrap_env(env)`` for episodes, ``dsec.training_step()`` around a custom
step, ``dsec.watch_ddp(model)`` for DDP buckets, ``dsec.sb3_callback()`` for SB3,
``dsec.trainer_callback()`` for transformers and TRL.

The names resolve on first use (PEP 562), so ``import dsec.schemas`` loads neither
torch nor a Kafka client.
"""

from __future__ import annotations

import importlib
from typing import Any

_FACADE = "dsec.facade"

# public name -> module that defines it
_NAMES: dict[str, str] = {
    "ActionKind": "dsec.schemas",
    "ProbeConfig": "dsec.ingest",
    "ProbeCounters": "dsec.ingest",
    "RestoredState": "dsec.actuators.restore",
    "WorkerControls": "dsec.actuators.worker_controls",
    "WorkerRuntime": "dsec.runtime",
    **{
        name: _FACADE
        for name in (
            "apply_pending", "autocast", "clip_grad_norm_", "controls", "current",
            "enable_snapshots", "init", "note_accumulation", "note_grad_norm", "on_action",
            "report_episode_end", "report_resume", "report_step", "restore", "sb3_callback",
            "shutdown", "skip_nonfinite_steps", "trainer_callback",
            "training_step", "watch_ddp", "wrap_env",
        )
    },
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    module_name = _NAMES.get(name)
    if module_name is None:
        raise AttributeError(f"module 'dsec' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
