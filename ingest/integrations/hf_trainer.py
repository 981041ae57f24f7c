"""A transformers ``TrainerCallback`` (TRL's trainers are Trainers: SFT, GRPO, PPO, DPO ...).

``trainer.add_callback(dsec.trainer_callback())`` (or ``dsec run``, which adds it to every
Trainer built) reports:

- every optimizer step, with the probe's own gradient norms, through the trainer's
  optimizer (the torch optimizer inside accelerate's wrapper), watched for the run;
- every training log as a step sample: ``loss``, ``grad_norm`` (the trainer's clipping
  norm), ``step_time``; and GRPO's ``reward`` / PPO's ``objective/rlhf_reward`` with the
  mean completion length as an episode sample (the logged mean: TRL logs no per-completion
  reward);
- the trainer's own save path, for snapshot commands: ``request_save`` asks the trainer
  to save (``control.should_save``), which it does at the end of the step the command
  arrived in, a full checkpoint (model, optimizer, scheduler, RNG) in
  ``output_dir/checkpoint-N``, and ``saved`` lists what it wrote. The apply hooks built on
  it (the top layer's ``dsec.zerotouch.frameworks.trainer_hooks``) are registered at
  ``on_train_begin`` through ``register_hooks``.

Commands are applied at optimizer-step boundaries, as in any watched loop.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from dsec.ingest.integrations.logged import LoggedKeys, record_logged

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - exercised without transformers
    raise ImportError("dsec's Trainer callback needs transformers: pip install transformers"
                      ) from exc

log = logging.getLogger(__name__)

TRAINER_KEYS = LoggedKeys(
    loss=("loss",), grad_norm=("grad_norm",), step_time_s=("step_time",),
    reward=("reward", "objective/rlhf_reward", "objective/scores"),
    length=("completions/mean_length",),
)


def _current_probe() -> Any:
    from dsec.ingest.current import current_probe

    return current_probe()


class DsecTrainerCallback(TrainerCallback):
    def __init__(self, probe: Any = None,
                 register_hooks: Callable[[DsecTrainerCallback], None] | None = None,
                 watch_optimizer: bool = True) -> None:
        """``register_hooks(callback)`` registers this worker's apply hooks that act through
        the trainer (snapshots through its save path), when training begins."""
        self._probe = probe
        self._register_hooks = register_hooks
        self._watch_optimizer = watch_optimizer
        self._watched_here = False
        self._control: Any = None
        self._args: Any = None
        self._state: Any = None
        self.save_requested_at: int | None = None
        self.saved: list[str] = []

    @property
    def probe(self) -> Any:
        if self._probe is None:
            self._probe = _current_probe()
        return self._probe

    def on_train_begin(self, args: Any, state: Any, control: Any, optimizer: Any = None,
                       **kwargs: Any) -> None:
        self._args, self._state, self._control = args, state, control
        probe = self.probe
        if probe is None:
            log.warning("dsec: the Trainer is not reported, dsec.init() was not called")
            return
        inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper
        if self._watch_optimizer and inner is not None and not probe.watching:
            probe.watch(inner)
            self._watched_here = True
        if self._register_hooks is not None:
            self._register_hooks(self)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._control = control

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        probe = self.probe
        if probe is None or not logs:
            return
        try:
            record_logged(probe, state.global_step, logs, TRAINER_KEYS)
        except Exception:  # telemetry never stops training
            log.exception("dsec: a Trainer log was not reported")

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.save_requested_at is None:
            return
        path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if os.path.isdir(path):
            self.saved.append(path)
        self.save_requested_at = None

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._watched_here:
            self.probe.unwatch()
            self._watched_here = False

    def request_save(self) -> str:
        """Asks the trainer to save at the end of this step; the checkpoint's path."""
        if self._control is None:
            raise RuntimeError("the Trainer is not training: nothing to save")
        self._control.should_save = True
        self.save_requested_at = self._state.global_step
        return os.path.join(self._args.output_dir, f"checkpoint-{self._state.global_step + 1}")
