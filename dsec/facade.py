"""The functions behind ``import dsec``: one worker runtime per process.

Three lines in a training script::

    dsec.init(bootstrap="127.0.0.1:9092", worker_id="w0", optimizer=opt)
    dsec.report_episode_end(reward, length)
    dsec.shutdown()

and, for the actions that change the loop: ``with dsec.autocast():`` around the
forward pass, ``dsec.controls()`` for the rest, ``dsec.enable_snapshots(model, opt)``
and ``dsec.restore(location, model, opt)``.
Or ``env = dsec.wrap_env(env)`` for episodes, ``dsec.training_step()`` around a custom
step, ``dsec.watch_ddp(model)`` for DDP buckets, ``dsec.sb3_callback()`` for SB3.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Literal

from pydantic import SecretStr

from dsec.actuators.restore import RestoredState
from dsec.actuators.restore import restore as _restore
from dsec.actuators.step_guard import NonFiniteStepGuard
from dsec.actuators.worker_controls import WorkerControls
from dsec.ingest import ProbeConfig, ProbeCounters
from dsec.ingest.current import set_current_probe
from dsec.ingest.loop import StepScope
from dsec.runtime import WorkerRuntime, default_worker_id
from dsec.schemas import ActionKind, WorkerIdentity
from dsec.schemas.settings import DsecSettings

__all__ = [
    "ActionKind",
    "ProbeConfig",
    "ProbeCounters",
    "RestoredState",
    "WorkerControls",
    "WorkerRuntime",
    "apply_pending",
    "autocast",
    "clip_grad_norm_",
    "controls",
    "current",
    "enable_snapshots",
    "init",
    "note_accumulation",
    "note_grad_norm",
    "on_action",
    "report_episode_end",
    "report_resume",
    "report_step",
    "restore",
    "sb3_callback",
    "shutdown",
    "skip_nonfinite_steps",
    "trainer_callback",
    "training_step",
    "watch_ddp",
    "wrap_env",
]

log = logging.getLogger(__name__)

_runtime: WorkerRuntime | None = None
# ``dsec run``: starts this process's runtime when something first needs it (None: not run
# under ``dsec run``), and whether the runtime in force is the one it started.
_autostart: Callable[[], Any] | None = None
_autostarted = False


def set_autostart(start: Callable[[], Any] | None) -> None:
    """``dsec run``: the function that starts this process's runtime (through ``adopt``)
    the first time ``current()`` finds none, so that the one-line additions (e.g.
    ``dsec.report_episode_end``) work in a program ``dsec run`` instruments."""
    global _autostart
    _autostart = start


def running() -> WorkerRuntime | None:
    """The runtime in force, or None; starts nothing."""
    return _runtime


def adopt(runtime: WorkerRuntime) -> WorkerRuntime:
    """``dsec run``: makes the runtime it started this process's, as ``init`` would; a
    later ``dsec.init()`` in the program returns it rather than failing."""
    global _runtime, _autostarted
    if _runtime is not None:
        raise RuntimeError("this process already has a dsec runtime")
    _runtime, _autostarted = runtime, True
    set_current_probe(runtime.probe)
    return runtime


def init(
    bootstrap: str | None = None,
    worker_id: str | None = None,
    *,
    job_id: str | None = None,
    node_id: str | None = None,
    pool: str | None = None,
    labels: dict[str, str] | None = None,
    optimizer: Any = None,
    settings: DsecSettings | None = None,
    probe_config: ProbeConfig | None = None,
    actuate: bool = True,
    endpoint: str | None = None,
    endpoint_token: str | None = None,
) -> WorkerRuntime:
    """Starts this worker's probe (and its actuator); arguments win over ``DSEC_*`` variables.

    ``pool``: the resource pool the worker runs in (``DSEC_POOL``); ``labels``: what policy
    selectors may match it by (``DSEC_LABELS``). Both travel in its identity.

    ``endpoint="http://dsec-control-plane:8080"`` (or ``DSEC_ENDPOINT``): a worker that
    cannot reach Kafka publishes through the ingest gateway instead, with the same batching,
    buffering and drop counts; ``endpoint_token`` (``DSEC_ENDPOINT_TOKEN``) is the
    gateway's enrolment token or this worker's runtime token.

    Under ``dsec run`` the runtime it started is returned (every optimizer's steps are
    already counted, so ``optimizer`` adds nothing).
    """
    global _runtime
    if _runtime is not None and _autostarted:
        log.info("dsec.init(): `dsec run` started this worker's runtime already; using it")
        return _runtime
    if _runtime is not None:
        raise RuntimeError("dsec.init() was already called in this process; call dsec.shutdown()")
    given = {"bootstrap": bootstrap, "job_id": job_id, "pool": pool, "labels": labels,
             "endpoint": endpoint,
             "endpoint_token": SecretStr(endpoint_token) if endpoint_token else None}
    overrides = {k: v for k, v in given.items() if v}
    resolved = settings.model_copy(update=overrides) if settings else DsecSettings(**overrides)
    import socket

    identity = WorkerIdentity(
        job_id=resolved.job_id,
        worker_id=worker_id or default_worker_id(),
        node_id=node_id or resolved.node_id or socket.gethostname(),
        pool=resolved.pool,
        labels=resolved.labels or None,
    )
    runtime = WorkerRuntime(resolved, identity, probe_config, actuate=actuate)
    if optimizer is not None:
        runtime.probe.watch(optimizer)
    _runtime = runtime.start()
    set_current_probe(runtime.probe)
    return runtime


def current() -> WorkerRuntime:
    if _runtime is None and _autostart is not None:
        _autostart()
    if _runtime is None:
        raise RuntimeError("call dsec.init() first")
    return _runtime


def report_episode_end(
    reward: float,
    length: int,
    *,
    terminated: bool = True,
    truncated: bool = False,
    termination_reason: str | None = None,
    on_training_thread: bool = True,
) -> None:
    """An episode ended; on the training thread this is a step boundary too (commands are
    applied here). ``on_training_thread=False`` from an asynchronous sampling thread."""
    current().probe.record_episode(
        reward, length, terminated=terminated, truncated=truncated,
        termination_reason=termination_reason, on_training_thread=on_training_thread,
    )


def report_step(loss: Any = None) -> None:
    """One training step's loss (tensor or float).

    With a watched optimizer the step sample is recorded by its hook and this only adds
    the loss to it; without one, this records the step.
    """
    probe = current().probe
    if probe.watching:
        probe.note_loss(loss)
    else:
        probe.record_step(loss=loss)


def note_grad_norm(total_norm: Any) -> None:
    """The total gradient norm the trainer already computed (e.g. when clipping): the probe
    reports it for this step instead of computing its own."""
    current().probe.note_grad_norm(total_norm)


def note_accumulation(micro_steps: int, parameters: Any = None) -> None:
    """The loop accumulates gradients over ``micro_steps`` backwards per optimizer step
    (1: it does not). While it does, the probe reports the gradient norm of every
    micro-step, so instability stays visible through the averaging; call it when the
    window changes, or every step (only a change costs anything). The parameters are the
    watched optimizer's unless given. ``controls().grad_accumulation.micro_step()`` tells
    the probe by itself."""
    current().probe.observe_micro_steps(micro_steps, parameters)


def clip_grad_norm_(
    parameters: Any,
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> Any:
    """``torch.nn.utils.clip_grad_norm_`` whose returned total norm the probe reuses."""
    import torch

    total_norm = torch.nn.utils.clip_grad_norm_(
        parameters, max_norm, norm_type, error_if_nonfinite=error_if_nonfinite, foreach=foreach
    )
    if _runtime is not None and norm_type == 2.0:
        _runtime.probe.note_grad_norm(total_norm)
    return total_norm


def training_step() -> StepScope:
    """``with dsec.training_step() as step:`` around one step of a custom loop, or
    ``@dsec.training_step()`` on a function that returns the loss."""
    return StepScope(lambda: current().probe)


def wrap_env(env: Any, reason_key: str = "termination_reason", reason_fn: Any = None) -> Any:
    """A gymnasium env that reports each finished episode to this worker's probe."""
    from dsec.ingest.gym_wrapper import EpisodeReporter

    return EpisodeReporter(env, reason_key=reason_key, reason_fn=reason_fn)


def watch_ddp(ddp_model: Any, state: Any = None, inner: Any = None) -> None:
    """Times DDP's gradient-bucket all-reduces through a communication hook, the one by
    which the actuator's gradient compression and sync priority act (unless ``inner``,
    a hook of your own, takes its place)."""
    current().watch_ddp(ddp_model, state=state, inner=inner)


def trainer_callback() -> Any:
    """A transformers/TRL ``TrainerCallback`` reporting to this worker; snapshot commands go
    through the trainer's save path (``trainer.add_callback(dsec.trainer_callback())``)."""
    from dsec.ingest.integrations.hf_trainer import DsecTrainerCallback
    from dsec.zerotouch.frameworks import trainer_hooks

    runtime = current()

    def register_hooks(callback: DsecTrainerCallback) -> None:
        for kind, hook in trainer_hooks(callback).items():
            runtime.on_action(kind, hook)

    return DsecTrainerCallback(probe=runtime.probe, register_hooks=register_hooks)


def sb3_callback(reason_key: str = "termination_reason") -> Any:
    """A Stable-Baselines3 callback reporting to this worker (``pip install 'dsec[sb3]'``)."""
    from dsec.ingest.sb3 import DsecCallback

    return DsecCallback(reason_key=reason_key)


def on_action(kind: ActionKind | str) -> Callable[[Callable[[Any], str | None]], Callable]:
    """Decorator: registers the function that applies ``kind`` inside this worker."""

    def register(hook: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
        current().on_action(kind, hook)
        return hook

    return register


def apply_pending() -> int:
    """Applies the actuation commands that arrived since the last step boundary, now (a
    safe point of the loop's own, such as the start of an update); returns how many."""
    return current().apply_pending()


def controls() -> WorkerControls:
    """What the actuator can change in this worker: memory budget, precision, gradient
    compression and accumulation, sampler gate, sync priority, snapshot trigger."""
    return current().controls


def autocast(dtype: str | None = None) -> Any:
    """``with dsec.autocast():`` around the forward pass; the actuator switches its dtype
    (bf16, fp16 with ``dsec.controls().precision.scaler``, fp32) between steps.
    ``dtype``: this loop's own precision (default fp32), which an undo returns to."""
    return current().controls.precision(dtype)


def skip_nonfinite_steps(optimizer: Any) -> NonFiniteStepGuard:
    """Keeps every optimizer step whose gradients hold a NaN or an Inf off the weights and
    the optimizer's moments, as loss scaling does in fp16, at any precision (one fused norm
    and one read to the host a step). Returns the guard: ``skipped_steps`` counts them."""
    return NonFiniteStepGuard(optimizer)


def enable_snapshots(
    model: Any,
    optimizer: Any = None,
    *,
    directory: str | None = None,
    quantise_weights: bool = False,
    quantise_optimizer: bool = False,
    extra_state: Callable[[], dict[str, Any]] | None = None,
) -> Any:
    """Lets snapshot commands snapshot ``model`` and ``optimizer`` (plus ``extra_state()``,
    e.g. episode-buffer head and replay-buffer metadata hash); returns the snapshotter."""
    return current().enable_snapshots(model, optimizer, directory=directory,
                                      quantise_weights=quantise_weights,
                                      quantise_optimizer=quantise_optimizer,
                                      extra_state=extra_state)


def restore(
    location: str | None = None, model: Any = None, optimizer: Any = None,
    *, restore_rng: bool = True, report: bool = True,
) -> RestoredState:
    """Rebuilds state from the newest verified snapshot in ``location`` (default: this
    worker's snapshot directory) into ``model`` and ``optimizer``. After ``dsec.init``,
    the resume is reported (``report_resume("snapshot", ...)`` with the time it took)
    unless ``report`` is False, for a loop that reports its resume itself."""
    if location is None:
        location = current().settings.snapshot_location()
    started_s = time.monotonic()
    state = _restore(location, model, optimizer, restore_rng=restore_rng)
    if report and _runtime is not None:
        _runtime.report_resume("snapshot", time.monotonic() - started_s, state.global_step)
    return state


def report_resume(source: Literal["snapshot", "checkpoint", "scratch"], recovery_time_s: float,
                  step: int | None = None) -> None:
    """This worker resumed after an interruption: from a dsec snapshot, a checkpoint of
    its own, or from scratch, taking ``recovery_time_s`` (``dsec.restore`` reports its
    own)."""
    current().report_resume(source, recovery_time_s, step)


def shutdown() -> ProbeCounters | None:
    """Flushes what the probe holds and stops it; safe to call twice."""
    global _runtime, _autostarted
    runtime, _runtime, _autostarted = _runtime, None, False
    set_current_probe(None)
    return runtime.shutdown() if runtime is not None else None
