"""The probe: records health samples from the training thread and ships them off it.

A thin composition of parts with one job each:

- ``StepSampler`` (training thread): counts every step, records the steps due for a sample,
  every episode, and runs the step callbacks after a ``wake``;
- ``OptimizerHooks``: the post-step hook on watched optimizers, gradient norms included;
- ``SampleBuffer``: the bounded buffer and the counts of what was kept, sent and dropped;
- ``Flusher``: one flush, the buffer to the transport in ``MetricBatch`` messages, then a
  heartbeat when due;
- ``FlushThread``: flushes every flush interval, at once for a NaN/Inf sample, and last
  at shutdown.

Every time they read comes from one injected ``Clock`` (the system's by default), so a
test moves time by hand and flushes with ``flush()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dsec.ingest.buffer import ProbeCounters, SampleBuffer
from dsec.ingest.callbacks import Callback, Callbacks
from dsec.ingest.clock import Clock, SystemClock
from dsec.ingest.config import ProbeConfig
from dsec.ingest.flush_thread import FlushThread
from dsec.ingest.flusher import Flusher
from dsec.ingest.optimizer_hooks import OptimizerHooks
from dsec.ingest.step_sampler import StepSampler, nonfinite_number
from dsec.ingest.transport import Transport
from dsec.schemas import WorkerIdentity

__all__ = ["Probe", "ProbeCounters"]


class Probe:
    # The training thread's calls go straight to the sampler's methods (bound in
    # ``__init__``), not through a method of the probe: no extra call on every step.
    # Their documentation is on ``StepSampler``.
    record_episode: Callable[..., None]
    note_loss: Callable[[Any], None]
    note_grad_norm: Callable[[Any], None]
    record_step: Callable[..., None]

    def __init__(
        self,
        identity: WorkerIdentity,
        metrics_topic: str,
        transport: Transport,
        config: ProbeConfig | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.identity = identity
        self.config = config = config or ProbeConfig()
        clock = clock or SystemClock()
        self._now_ms = clock.now_ms
        self._transport = transport
        self._buffer = SampleBuffer(config.buffer_max_samples)
        self._collectors = Callbacks("collector", log_each_failure=False)
        self._step_callbacks = Callbacks("step callback")
        self._flusher = Flusher(
            self._buffer, transport, identity, metrics_topic, clock,
            max_samples_per_message=config.max_samples_per_message,
            heartbeat_interval_s=config.heartbeat_interval_s,
            global_step=lambda: self._sampler.global_step,
            before_send=self._before_send,
        )
        self._thread = FlushThread(self._flusher.flush, config.flush_interval_s, clock)
        self._sampler = sampler = StepSampler(config, self._buffer.record, clock,
                                              self._thread.flush_soon, self._step_callbacks.run)
        self._hooks = OptimizerHooks(sampler, clock)
        self.record_episode = sampler.record_episode
        self.note_loss = sampler.note_loss
        self.note_grad_norm = sampler.note_grad_norm
        self.record_step = sampler.record_step

    # --- samples from any thread -----------------------------------------------------

    def record_grad_sync(
        self,
        step: int,
        nbytes: int,
        latency_ms: float,
        ok: bool,
        op: str,
        timer: str = "wall_clock",
        error: str | None = None,
    ) -> None:
        """One gradient synchronisation; safe from any thread."""
        self._buffer.record(("grad_sync", self._now_ms(), step, nbytes, latency_ms, ok, op,
                             timer, error))

    def record_logged_step(
        self, step: int, loss: Any = None, grad_norm: Any = None,
        step_time_ms: float | None = None,
    ) -> None:
        """A step as a framework's log reports it (its loss, gradient norm and step time):
        a sample of its own, the norm marked ``"trainer"``; the probe's step count and
        sampling are left alone. Any thread; a NaN/Inf value is flushed at once."""
        self._buffer.record(("step", self._now_ms(), int(step), loss, grad_norm, step_time_ms,
                             None if grad_norm is None else "trainer"))
        if nonfinite_number(loss) or nonfinite_number(grad_norm):
            self._thread.flush_soon()

    def record_fields(self, kind: str, fields: dict[str, Any]) -> None:
        """A low-rate sample (``gpu``, ``cuda_memory``) given as its wire fields; any thread."""
        self._buffer.record(("fields", self._now_ms(), kind, fields))

    def name_gpu(self, gpu_uuid: str) -> None:
        """Names the GPU this process uses in its messages (which workers share a card is
        told from it); any thread."""
        self._flusher.name_gpu(gpu_uuid)

    # --- steps and optimizers --------------------------------------------------------

    @property
    def global_step(self) -> int:
        return self._sampler.global_step

    @property
    def grad_norm_interval_steps(self) -> int:
        """Steps between two gradient norms, as the probe spaces them now."""
        return self._sampler.grad_norm_interval_steps

    @property
    def step_sample_interval_steps(self) -> int:
        """Steps between two step samples, as the probe spaces them now."""
        return self._sampler.step_sample_interval_steps

    @property
    def watching(self) -> bool:
        return self._hooks.watching

    def watch(self, optimizer: Any) -> None:
        """Hooks an optimizer: its steps are counted and sampled, norms included."""
        self._hooks.watch(optimizer)

    def step_hook(self) -> Callable[[Any, Any, Any], None]:
        """The post-step hook ``watch`` registers, for a caller that hooks every optimizer
        itself (see ``OptimizerHooks.step_hook``)."""
        return self._hooks.step_hook()

    def unwatch(self) -> None:
        """Removes the optimizer hooks (the probe keeps running)."""
        self._hooks.unwatch()

    def observe_micro_steps(self, micro_steps: int, parameters: Any = None) -> None:
        """The loop accumulates ``micro_steps`` backwards per step: above 1, every
        micro-step's gradient norm is a sample (see ``OptimizerHooks``)."""
        self._hooks.observe_micro_steps(micro_steps, parameters)

    def add_step_callback(self, callback: Callback) -> None:
        """Runs ``callback`` on the training thread at the first step or episode boundary
        after a ``wake``: at least once a flush interval while steps go on (every flush
        wakes them), and one step after a command arrived. Steps in between pay nothing
        for it."""
        self._step_callbacks.add(callback)

    def wake(self) -> None:
        """Asks for the step callbacks at the next step boundary; from any thread."""
        self._sampler.wake()

    def run_step_callbacks(self) -> None:
        """Runs the step callbacks now, on the calling (training) thread."""
        self._sampler.run_step_callbacks()

    # --- flushing --------------------------------------------------------------------

    def add_collector(self, collector: Callback) -> None:
        """Runs ``collector`` before every flush, on the flushing thread (it keeps its own
        pace)."""
        self._collectors.add(collector)

    def _before_send(self) -> None:
        self._sampler.check_losses()
        self._collectors.run()
        self._sampler.wake()  # the step callbacks run at least once a flush interval

    def flush(self) -> None:
        """Ships what is buffered now, from the calling thread, with a heartbeat when one
        is due; the flush thread does this every flush interval."""
        self._flusher.flush()

    def start(self) -> None:
        """Starts the flush thread; its first flush says the worker is here (a heartbeat)."""
        if self._thread.running:
            return
        self._flusher.heartbeat_at_next_flush()
        self._thread.start()

    def counters(self) -> ProbeCounters:
        return self._buffer.counters()

    def publish(self, topic: str, key: bytes, value: bytes) -> None:
        """Sends a message of another kind (an actuation result) through the probe's producer."""
        self._flusher.publish(topic, key, value)

    def shutdown(self) -> ProbeCounters:
        """Stops the thread after a last flush, waits for delivery (bounded), lets go of
        the transport."""
        self.unwatch()
        self._thread.stop()
        self._transport.flush(self.config.shutdown_flush_timeout_s)
        self._transport.close()
        return self.counters()
