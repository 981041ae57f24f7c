"""One instrumented process: the import hooks, and the runtime they start on first need.

``install()`` (the ``sitecustomize`` of ``dsec run``, or a framework's plugin hook) only
registers import hooks; nothing heavy is imported. Once torch is imported, every
optimizer built is remembered, every optimizer step goes through one global post-step hook,
``torch.distributed.all_reduce`` is timed, each ``DistributedDataParallel`` gets a timed
communication hook and the program's autocast regions follow precision commands. Once
gymnasium is imported, ``gym.make`` environments report their episodes.

The worker's runtime (probe, actuator, NVML, CUDA memory) starts at the first signal: an
optimizer step, an episode end, a gradient sync, or a ``dsec.*`` call of the program's
own. A process that never trains (torchrun's launcher, a helper script) starts nothing
and publishes nothing. Its identity comes from the environment (``identity.py``).

Nothing here may stop the program: an instrumentation that fails is logged once and the
program goes on without it; a runtime that cannot start leaves the program uninstrumented.
At exit the probe flushes what it holds and says what it dropped.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from dsec.zerotouch.identity import nvml_indices, process_identity, ray_context
from dsec.zerotouch.import_hooks import when_imported

log = logging.getLogger(__name__)

# At exit the actuator's consumer is a daemon thread: waiting longer for one stuck on an
# unreachable broker would only hold the program's exit.
ACTUATOR_STOP_TIMEOUT_S = 1.0


class ZeroTouch:
    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        from dsec.zerotouch.autocast import AutocastOverride
        from dsec.zerotouch.optimizers import OptimizerRegistry

        self._env = os.environ if env is None else env
        self._lock = threading.RLock()
        self._runtime: Any = None
        self._started_here = False
        self._disabled = False  # the runtime could not start: the program runs without it
        self._failed: set[str] = set()
        self._step_hook: Callable[[Any, Any, Any], None] = self._first_step
        self._probe_step_hook: Callable[[Any, Any, Any], None] | None = None
        self._grad_sync: Any = None
        self.optimizers = OptimizerRegistry()
        self.step_guard: Any = None  # the step guard, where the run asked for it
        self.autocast = AutocastOverride()

    # --- installing ------------------------------------------------------------------

    def install(self) -> ZeroTouch:
        """Registers the import hooks (those of modules already imported run now)."""
        for name, handler in (("torch", self._instrument_torch),
                              ("gymnasium", self._instrument_gymnasium),
                              ("transformers.trainer", self._instrument_trainer),
                              ("verl.utils.tracking", self._instrument_verl)):
            when_imported(name, self._guarded(name, handler))
        # these load the whole runtime: hooked when the program (or a start) loads them, so
        # that dsec's own one-liners and integrations start the runtime on first need
        when_imported("dsec.facade", lambda facade: facade.set_autostart(self.runtime))
        when_imported("dsec.ingest.current", lambda current: current.set_starter(self.runtime))
        from dsec.zerotouch.log_once import OncePerMessage

        OncePerMessage.install()
        return self

    def _guarded(self, what: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def guarded(*args: Any) -> Any:
            try:
                return function(*args)
            except Exception:  # instrumentation never stops the program
                self._failed_once(what)
                return None

        return guarded

    def _failed_once(self, what: str) -> None:
        if what not in self._failed:
            self._failed.add(what)
            log.exception("dsec: %s not instrumented; the program goes on without it", what)

    def _instrument_torch(self, torch: ModuleType) -> None:
        for what, part in (("optimizer steps", self._instrument_optimizers),
                           ("the loss", self._instrument_backward),
                           ("the clipping norm", self._instrument_clipping),
                           ("autocast", self._instrument_autocast),
                           ("torch.distributed", self._instrument_distributed)):
            self._guarded(what, part)(torch)

    def _instrument_optimizers(self, torch: ModuleType) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.optimizers.install(torch.optim.Optimizer)
        register_optimizer_step_post_hook(self._after_step)
        self._guard_steps()

    def _guard_steps(self) -> None:
        """The step guard on every optimizer's steps, where the run asked for it
        (``dsec run --skip-nonfinite-steps``)."""
        from dsec.zerotouch.appliers import SKIP_NONFINITE_ENV

        if self._env.get(SKIP_NONFINITE_ENV) == "1":
            from dsec.actuators.step_guard import NonFiniteStepGuard

            self.step_guard = NonFiniteStepGuard()

    def _instrument_backward(self, torch: ModuleType) -> None:
        from dsec.zerotouch.losses import install_loss_hook

        install_loss_hook(torch.Tensor, self._note_loss)

    def _instrument_clipping(self, torch: ModuleType) -> None:
        from dsec.zerotouch.losses import install_clip_hook

        install_clip_hook(torch.nn.utils, self._note_grad_norm)

    def _instrument_autocast(self, torch: ModuleType) -> None:
        self.autocast.install(torch.amp.autocast_mode.autocast)

    def _instrument_distributed(self, torch: ModuleType) -> None:
        if not torch.distributed.is_available():
            return
        from torch.nn.parallel import DistributedDataParallel

        from dsec.ingest.grad_sync import GradSyncTimer, instrument_all_reduce
        from dsec.zerotouch.ddp import DdpHooks

        self._grad_sync = GradSyncTimer(self)
        instrument_all_reduce(self._grad_sync)
        DdpHooks(self._grad_sync).install(DistributedDataParallel)

    def _instrument_gymnasium(self, gymnasium: ModuleType) -> None:
        from dsec.zerotouch.gym import install_make

        install_make(gymnasium, self)

    def _instrument_trainer(self, trainer_module: ModuleType) -> None:
        from dsec.ingest.integrations.hf_trainer import DsecTrainerCallback
        from dsec.zerotouch.frameworks import add_to_every_instance, trainer_hooks

        def register_hooks(callback: Any) -> None:
            for kind, hook in trainer_hooks(callback).items():
                self.on_action(kind, hook)

        def add_callback(trainer: Any) -> None:
            if not any(isinstance(callback, DsecTrainerCallback)
                       for callback in trainer.callback_handler.callbacks):
                trainer.add_callback(DsecTrainerCallback(register_hooks=register_hooks))

        add_to_every_instance(trainer_module.Trainer, add_callback)

    def _instrument_verl(self, tracking_module: ModuleType) -> None:
        from dsec.ingest.integrations.verl import attach
        from dsec.zerotouch.frameworks import add_to_every_instance

        add_to_every_instance(tracking_module.Tracking, attach)

    def on_action(self, kind: str, hook: Callable[[Any], Any]) -> None:
        """Registers an apply hook in this worker (an integration's: it replaces the
        zero-touch one for its kind)."""
        runtime = self.runtime()
        if runtime is not None:
            runtime.on_action(kind, hook)

    # --- the signals -----------------------------------------------------------------

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._step_hook(optimizer, args, kwargs)

    def _first_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.runtime()
        if self._probe_step_hook is not None:  # started: this step is its first
            self._probe_step_hook(optimizer, args, kwargs)

    @staticmethod
    def _no_step(_optimizer: Any, _args: Any, _kwargs: Any) -> None:
        return None

    def _note_loss(self, loss: Any) -> None:
        runtime = self._runtime
        if runtime is not None:
            runtime.probe.note_loss(loss)

    def _note_grad_norm(self, total_norm: Any) -> None:
        runtime = self._runtime
        if runtime is not None:
            runtime.probe.note_grad_norm(total_norm)

    @property
    def global_step(self) -> int:
        """For the gradient-sync timer: read when a sync begins, which starts nothing (a
        DDP bucket begins inside the backward)."""
        runtime = self._runtime
        return 0 if runtime is None else runtime.probe.global_step

    def record_grad_sync(self, *args: Any, **kwargs: Any) -> None:
        runtime = self.runtime()
        if runtime is not None:
            runtime.probe.record_grad_sync(*args, **kwargs)

    def record_episode(self, *args: Any, **kwargs: Any) -> None:
        runtime = self.runtime()
        if runtime is not None:
            runtime.probe.record_episode(*args, **kwargs)


    # --- the runtime -----------------------------------------------------------------

    def runtime(self) -> Any:
        """This process's runtime, started now if it is not yet; None when it cannot be."""
        runtime = self._runtime
        if runtime is not None or self._disabled:
            return runtime
        with self._lock:
            if self._runtime is None and not self._disabled:
                try:
                    self._start()
                except Exception:  # the program runs on, uninstrumented
                    self._disabled = True
                    self._step_hook, self._probe_step_hook = self._no_step, None
                    log.exception("dsec: the worker runtime did not start; the program runs "
                                  "uninstrumented")
        return self._runtime

    def _start(self) -> None:
        from dsec import facade

        runtime = facade.running()
        if runtime is not None:  # the program called dsec.init() itself: its runtime it is
            self._attach(runtime)
            self._step_hook = self._no_step  # its optimizer, if any, is watched already
            if not runtime.probe.watching:
                self._use_step_hook(runtime)
            return
        from dsec.ingest import ProbeConfig
        from dsec.runtime import WorkerRuntime
        from dsec.schemas import WorkerIdentity
        from dsec.schemas.settings import DsecSettings
        from dsec.zerotouch.appliers import ZeroTouchAppliers
        from dsec.zerotouch.log_once import KAFKA_LOGGER

        settings = DsecSettings()
        import socket

        found = process_identity(self._env, socket.gethostname(), os.getpid(), ray_context())
        probe_overrides: dict[str, Any] = {"grad_sync_timing": False}  # timed from import on
        if "DSEC_PROBE_GPU_INDICES" not in self._env:
            probe_overrides["gpu_indices"] = nvml_indices(self._env)
        identity = WorkerIdentity(job_id=settings.job_id, worker_id=found.worker_id,
                                  node_id=found.node_id)
        runtime = WorkerRuntime(settings, identity, ProbeConfig(**probe_overrides),
                                kafka_logger=logging.getLogger(KAFKA_LOGGER),
                                actuator_stop_timeout_s=ACTUATOR_STOP_TIMEOUT_S)
        ZeroTouchAppliers(self.optimizers, self.autocast).register(runtime, self._env)
        runtime.start(commands_ready_timeout_s=0)  # never hold the training step
        self._started_here = True
        self._attach(runtime)
        self._use_step_hook(runtime)
        facade.adopt(runtime)
        import atexit

        atexit.register(self.shutdown)
        log.info("dsec: worker %s (node %s, job %s) instrumented by dsec run",
                 identity.worker_id, identity.node_id, identity.job_id)

    def _use_step_hook(self, runtime: Any) -> None:
        self._probe_step_hook = self._step_hook = runtime.probe.step_hook()

    def _attach(self, runtime: Any) -> None:
        self._runtime = runtime
        if self._grad_sync is not None:
            runtime.probe.add_collector(self._grad_sync.collect)

    # --- exit ------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Flushes and stops the runtime this started (at exit); says what was dropped."""
        from dsec import facade

        self._step_hook, self._probe_step_hook = self._no_step, None
        runtime, self._runtime = self._runtime, None
        if runtime is None or not self._started_here:
            return
        try:
            counters = facade.shutdown() if facade.running() is runtime else None
        except Exception:
            log.exception("dsec: the worker runtime did not shut down cleanly")
            return
        if counters is not None and counters.samples_dropped:
            settings = runtime.settings
            log.warning("dsec: worker %s dropped %d of %d samples (%d messages not "
                        "delivered to %s)", runtime.identity.worker_id,
                        counters.samples_dropped, counters.samples_recorded,
                        counters.messages_failed, settings.endpoint or settings.bootstrap)


_installed: ZeroTouch | None = None


def install(env: Mapping[str, str] | None = None) -> ZeroTouch:
    """Instruments this process (once): the import hooks now, the runtime at first need."""
    global _installed
    if _installed is None:
        _installed = ZeroTouch(env).install()
    return _installed
