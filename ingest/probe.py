"""The probe: records health samples from the training thread and ships them off it.

The training thread only appends small tuples to a bounded buffer (one lock, no
I/O, no device sync), and on most steps not even that: it only counts the step. A
background thread turns the samples into one ``MetricBatch`` message per flush interval
(at once when a sample holds a NaN/Inf number),
adds the heartbeat, and hands it to the transport (and, when asked, checks the losses of
the steps between samples for NaN/Inf). Every sample that cannot be kept is counted and
reported in the next heartbeat.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from dsec.ingest.config import ProbeConfig
from dsec.ingest.encode import batch_columns, pack_long_columns
from dsec.ingest.micro_steps import MicroStepNorms
from dsec.ingest.sampling import SpacedWork, smoothed
from dsec.ingest.transport import Transport
from dsec.ingest.values import host_value, nonfinite_flags
from dsec.schemas import SCHEMA_VERSION, WorkerIdentity, new_event_id, now_ms
from dsec.schemas.metrics import MICRO_STEP

log = logging.getLogger(__name__)

StepCallback = Callable[[], None]
Collector = Callable[[], None]

# Losses of steps between samples, waiting for the flusher's NaN/Inf check. Beyond this many
# (a flusher held up for seconds on a fast loop) the oldest go unchecked.
LOSS_CHECKS_MAX = 8192
# The shortest time between two flushes when NaN/Inf samples ask for them sooner.
URGENT_GAP_S = 0.02


@dataclass(frozen=True)
class ProbeCounters:
    samples_recorded: int
    samples_sent: int
    samples_buffered: int
    samples_dropped: int
    messages_failed: int


def total_grad_norm(optimizer: Any) -> Any:
    """L2 norm of every gradient the optimizer holds, as a tensor (no device sync), or None.

    One fused ``_foreach_norm``; gradients on several devices meet on the first one's.
    """
    import torch

    grads = [
        p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None
    ]
    if not grads:
        return None
    with torch.no_grad():
        norms = torch._foreach_norm(grads)
        try:  # one device, the common case: no per-norm ``.to`` on the training thread
            return torch.linalg.vector_norm(torch.stack(norms))
        except RuntimeError:
            device = norms[0].device
            return torch.linalg.vector_norm(torch.stack([n.to(device) for n in norms]))


def _nonfinite_number(value: Any) -> bool:
    """A NaN/Inf float (a tensor is not read here)."""
    return type(value) is float and value - value != 0.0


class Probe:
    def __init__(
        self,
        identity: WorkerIdentity,
        metrics_topic: str,
        transport: Transport,
        config: ProbeConfig | None = None,
    ) -> None:
        self.identity = identity
        self.config = config or ProbeConfig()
        self._topic = metrics_topic
        self._key = identity.worker_id.encode()
        self._identity_fields = identity.model_dump()
        # Message ids: a random 64-bit prefix per probe and a counter (a uuid4 per message
        # costs a system call, ~70 us on the flusher's cold start).
        self._id_prefix = new_event_id()[:16]
        self._messages_encoded = 0
        self._transport = transport
        self._lock = threading.Lock()
        self._pending: list[tuple] = []
        self._in_flight = 0  # handed to the transport, delivery not yet known
        self._reserved = 0  # taken from the buffer for sending, transport not yet asked
        self._recorded = 0
        self._sent = 0
        self._dropped = 0
        self._messages_failed = 0
        self._episode_index = 0
        self._global_step = 0
        self._last_loss: Any = None
        self._loss_read_s = 0.0  # reading this step's loss, charged to its sample's cost
        self._last_grad_norm: Any = None
        self._grad_norm_from_trainer = False
        self._last_sample_s: float | None = None
        self._last_sample_step = 0
        # (step, loss) of steps between samples, checked for NaN/Inf by the flusher when asked
        self._check_every_loss = self.config.loss_check_every_step
        self._loss_checks: deque[tuple[int, Any]] = deque(maxlen=LOSS_CHECKS_MAX)
        # steps between two samples and between two norms: fixed, or (adaptive) 10 until
        # their cost is measured
        config = self.config
        self._samples = SpacedWork(config.step_sample_budget_fraction,
                                   config.step_sample_max_interval_steps,
                                   config.step_sample_every_n_steps)
        self._norms = SpacedWork(config.grad_norm_budget_fraction,
                                 config.grad_norm_max_interval_steps,
                                 config.grad_norm_every_n_steps)
        self._next_sample_step = 0
        self._next_norm_step = 0
        self._step_time_s: float | None = None  # smoothed, from the step samples
        # Steps before this one only count (the fast path): the sooner of the next sample and
        # the next norm, or 0 after a ``wake`` or a NaN/Inf float loss.
        self._fast_until_step = 0
        self._forced_step = -1  # a step made a sample by its NaN/Inf float loss
        self._step_callbacks: list[StepCallback] = []
        self._wake = False  # run the step callbacks at the next step boundary
        self._collectors: list[Collector] = []
        self._failed_collectors: set[int] = set()
        self._warned: set[str] = set()
        self._hook_handles: list[Any] = []
        self._watched: list[Any] = []  # the optimizers ``watch`` hooked
        # While the loop accumulates gradients: one norm per micro-step, none per step.
        self._micro = MicroStepNorms(self._record_micro_step_norm)
        self._stop = threading.Event()
        self._flush_soon = threading.Event()  # a NaN/Inf sample: flush now, not at the interval
        self._thread: threading.Thread | None = None
        self._last_heartbeat_s = time.monotonic()  # a probe not yet started owes none

    # --- training thread -------------------------------------------------------------

    def _record(self, sample: tuple) -> None:
        with self._lock:
            self._recorded += 1
            # A chunk out for sending still holds its place, so a refused one always fits back.
            if len(self._pending) + self._reserved >= self.config.buffer_max_samples:
                self._dropped += 1
                return
            self._pending.append(sample)

    def record_episode(
        self,
        reward: float,
        length: int,
        *,
        terminated: bool = True,
        truncated: bool = False,
        termination_reason: str | None = None,
    ) -> None:
        self._record(
            ("episode", now_ms(), self._episode_index, reward, length, terminated, truncated,
             termination_reason)
        )
        self._episode_index += 1
        if self._wake:
            self.run_step_callbacks()

    def _due(self, step: int) -> bool:
        return (step >= self._next_sample_step or step >= self._next_norm_step
                or step == self._forced_step)

    def _force(self, step: int) -> None:
        """Makes ``step`` a sample, gradient norm included: its loss is a NaN/Inf number."""
        self._forced_step = step
        self._fast_until_step = 0

    @property
    def grad_norm_interval_steps(self) -> int:
        """Steps between two gradient norms, as the probe spaces them now."""
        return self._norms.interval_steps

    @property
    def step_sample_interval_steps(self) -> int:
        """Steps between two step samples, as the probe spaces them now."""
        return self._samples.interval_steps

    def note_loss(self, loss: Any) -> None:
        """Keeps the loss for this step's sample; a tensor is read off the training thread.

        On a step not due for a sample, a loss given as a number is checked (a NaN/Inf one
        makes the step a sample, gradient norm included); a tensor is not read, unless
        ``loss_check_every_step``: then it is queued, and the flusher reads it and records a
        sample for the step when it is NaN/Inf. Either way the training thread never waits
        for a device.
        """
        if isinstance(loss, float) and not math.isfinite(loss):
            self._force(self._global_step)  # on any step: a number costs nothing to check
        elif self._global_step < self._fast_until_step:
            if self._check_every_loss:
                self._loss_checks.append((self._global_step, loss))
            return
        started_s = time.perf_counter()
        self._last_loss = host_value(loss)
        self._loss_read_s = time.perf_counter() - started_s

    def note_grad_norm(self, total_norm: Any) -> None:
        """The total gradient norm the trainer already has (``clip_grad_norm_`` returns it):
        the probe uses it for this step instead of computing its own."""
        if total_norm is None or not self._due(self._global_step) or self._micro.attached:
            return
        self._last_grad_norm = host_value(total_norm)
        self._grad_norm_from_trainer = True

    def record_step(self, loss: Any = None, grad_norm: Any = None) -> None:
        """One optimizer step; called by the optimizer hook or by a custom loop.

        A sample is recorded every ``step_sample_interval_steps`` steps and on every step whose
        gradient norm is computed; other steps only count (the fast path: a microsecond or
        two, cold caches included) and check a loss given as a number, as ``note_loss``
        does. The sample's step time is the mean since the previous sample.
        """
        step = self._global_step
        self._global_step = step + 1
        if isinstance(loss, float) and not math.isfinite(loss):
            # A number is checked on every step (no device involved), on the fast path or
            # off it (a step right after a wake is off it without being due for a sample).
            self._force(step)
        elif step < self._fast_until_step:
            if loss is not None and self._check_every_loss:
                self._loss_checks.append((step, loss))
            return
        self._step_boundary(step, loss, grad_norm, time.perf_counter())

    def _step_boundary(self, step: int, loss: Any, grad_norm: Any, entered_s: float) -> None:
        """A step off the fast path (since ``entered_s``): its sample when due, the step
        callbacks when woken.

        A sample's cost, which spaces the samples, is all it takes of the training thread:
        the loss read in ``note_loss``, the hook's way here and the sample itself (timing the
        sample alone would leave out a large part of it).
        """
        if self._due(step):
            self._sample(step, loss, grad_norm)
            self._samples.took(time.perf_counter() - entered_s + self._loss_read_s,
                               self._step_time_s)
            self._loss_read_s = 0.0
        elif loss is not None and self._check_every_loss:
            self._loss_checks.append((step, loss))
        if self._wake:
            self.run_step_callbacks()
        else:
            self._arm_fast_path()

    def _arm_fast_path(self) -> None:
        """The steps before the next one due for a sample or a norm only count."""
        self._fast_until_step = min(self._next_sample_step, self._next_norm_step)
        if self._wake:  # a wake that came while the line above ran is not overwritten
            self._fast_until_step = 0

    def _sample(self, step: int, loss: Any, grad_norm: Any) -> None:
        now_s = time.perf_counter()
        step_time_ms = None
        if self._last_sample_s is not None and step > self._last_sample_step:
            step_time_ms = (now_s - self._last_sample_s) * 1000.0 / (step - self._last_sample_step)
            self._step_time_s = smoothed(self._step_time_s, step_time_ms / 1000.0)
        if step >= self._next_norm_step:  # this step was the norm's turn
            self._next_norm_step = step + self._norms.interval_steps
        if step >= self._next_sample_step:  # and the sample's
            self._next_sample_step = step + self._samples.interval_steps
        self._last_sample_s = now_s
        self._last_sample_step = step
        loss = loss if loss is not None else self._last_loss
        from_trainer = self._grad_norm_from_trainer or grad_norm is not None
        grad_norm = grad_norm if grad_norm is not None else self._last_grad_norm
        if self._micro.attached:  # the micro-steps' norms stand for this step's
            grad_norm = None
        self._last_loss = None
        self._last_grad_norm = None
        self._grad_norm_from_trainer = False
        source = None if grad_norm is None else ("trainer" if from_trainer else "probe")
        self._record(("step", now_ms(), step, loss, grad_norm, step_time_ms, source))
        if step == self._forced_step or _nonfinite_number(loss) or _nonfinite_number(grad_norm):
            self._flush_soon.set()

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
        self._record(("grad_sync", now_ms(), step, nbytes, latency_ms, ok, op, timer, error))

    def record_fields(self, kind: str, fields: dict[str, Any]) -> None:
        """A low-rate sample (``gpu``, ``cuda_memory``) given as its wire fields; any thread."""
        self._record(("fields", now_ms(), kind, fields))

    def add_collector(self, collector: Collector) -> None:
        """Runs ``collector`` on the probe's thread before every flush (it keeps its own pace)."""
        self._collectors.append(collector)

    def add_step_callback(self, callback: StepCallback) -> None:
        """Runs ``callback`` on the training thread at the first step or episode boundary
        after a ``wake``: at least once a flush interval while steps go on (the flusher
        wakes them), and one step after a command arrived. Steps in between pay nothing
        for it."""
        self._step_callbacks.append(callback)

    def wake(self) -> None:
        """Asks for the step callbacks at the next step boundary; from any thread (an
        arrived command is applied one step later, not at the next sample)."""
        self._wake = True
        self._fast_until_step = 0

    def run_step_callbacks(self) -> None:
        """Runs the step callbacks now (on the training thread) and sets the fast path up
        to the next step due for a sample or a norm."""
        self._wake = False  # first: a wake during the callbacks asks for another run
        for callback in self._step_callbacks:
            try:
                callback()
            except Exception:  # telemetry never crashes the training loop
                log.exception("dsec step callback failed")
        self._arm_fast_path()

    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.exception(message)

    def watch(self, optimizer: Any) -> None:
        """Hooks an optimizer: after each step, the step is counted; on a step due for it,
        the gradient L2 norm is taken and a sample recorded.

        One post-step hook does it all (a second hook would cost every step a call). The
        norm is taken after the step: the optimizers read the gradients without changing
        them, and they are still in the cache then.
        """
        def after_step(opt: Any, _args: Any, _kwargs: Any) -> None:
            step = self._global_step  # the fast path, inline: no call on most steps
            self._global_step = step + 1
            if step < self._fast_until_step:
                return
            entered_s = time.perf_counter()
            if ((step >= self._next_norm_step or step == self._forced_step)
                    and not self._grad_norm_from_trainer and not self._micro.attached):
                self._take_norm(opt)
                entered_s = time.perf_counter()  # the norm is charged to the norms
            try:
                self._step_boundary(step, None, None, entered_s)
            except Exception:
                self._warn_once("record_step", "dsec: step not recorded")

        self._hook_handles.append(optimizer.register_step_post_hook(after_step))
        self._watched.append(optimizer)
        # a step time spans watched steps only: none runs across the time unwatched
        self._last_sample_s = None

    def _take_norm(self, optimizer: Any) -> None:
        try:
            started_s = time.perf_counter()
            self._last_grad_norm = host_value(total_grad_norm(optimizer))
            self._norms.took(time.perf_counter() - started_s, self._step_time_s)
        except Exception:  # sparse or unusual gradients: no norm, and training goes on
            self._warn_once("grad_norm", "dsec: gradient norm not computed")

    def unwatch(self) -> None:
        """Removes the optimizer hooks (the probe keeps running)."""
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles.clear()
        self._watched.clear()
        self._micro.detach()

    def observe_micro_steps(self, micro_steps: int, parameters: Any = None) -> None:
        """The loop runs ``micro_steps`` backwards per optimizer step (gradient accumulation).

        Above 1, the probe records the gradient norm of every micro-step (a sample of its
        own, ``grad_norm_source="micro_step"``) instead of the accumulated step's, so that
        a loss blowing up on some micro-steps and not on others still shows as swings
        rather than as a raised average. At 1 it goes back to step norms. The parameters
        are those of the watched optimizers unless given. Cheap to call every step: only a
        change does anything.
        """
        if (micro_steps > 1) == self._micro.attached:
            return
        if micro_steps <= 1:
            self._micro.detach()
            return
        if parameters is None:
            parameters = [p for optimizer in self._watched
                          for group in optimizer.param_groups for p in group["params"]]
        self._micro.attach(parameters)

    def _record_micro_step_norm(self, norm: Any) -> None:
        norm = host_value(norm)
        self._record(("step", now_ms(), self._global_step, None, norm, None, MICRO_STEP))
        if _nonfinite_number(norm):
            self._flush_soon.set()

    @property
    def watching(self) -> bool:
        return bool(self._hook_handles)

    @property
    def global_step(self) -> int:
        return self._global_step

    # --- background thread -----------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._last_heartbeat_s = float("-inf")  # the first flush says the worker is here
        self._thread = threading.Thread(target=self._run, name="dsec-probe", daemon=True)
        self._thread.start()

    def counters(self) -> ProbeCounters:
        with self._lock:
            return ProbeCounters(
                samples_recorded=self._recorded,
                samples_sent=self._sent,
                samples_buffered=len(self._pending) + self._in_flight,
                samples_dropped=self._dropped,
                messages_failed=self._messages_failed,
            )

    def _run(self) -> None:
        interval_s = self.config.flush_interval_s
        flushed_s = time.monotonic()
        while True:
            self._flush_soon.wait(interval_s)
            self._flush_soon.clear()
            if self._stop.is_set():
                break
            # woken early by a NaN/Inf sample: at most one such flush per URGENT_GAP_S, so a
            # loss that is NaN on every step does not turn into a message per step
            wait_s = min(interval_s, URGENT_GAP_S) - (time.monotonic() - flushed_s)
            if wait_s > 0 and self._stop.wait(wait_s):
                break
            flushed_s = time.monotonic()
            self._flush_safely()
        self._flush_safely(force_heartbeat=True)

    def _flush_safely(self, force_heartbeat: bool = False) -> None:
        try:
            self._flush_once(force_heartbeat)
        except Exception:  # the flusher outlives any one bad flush
            log.exception("dsec: flush failed")

    def _append_heartbeat(self) -> None:
        """The heartbeat is a sample too: recorded, then sent or dropped (when the buffer is
        full) like any other; the next one that gets through carries the totals."""
        with self._lock:
            self._recorded += 1
            if len(self._pending) + self._reserved >= self.config.buffer_max_samples:
                self._dropped += 1
                return
            self._pending.append((
                "heartbeat", now_ms(), self.config.heartbeat_interval_s, self._global_step,
                self._sent, len(self._pending) + self._in_flight, self._dropped,
                self._recorded, self._messages_failed,
            ))

    def _run_collectors(self) -> None:
        for index, collector in enumerate(self._collectors):
            try:
                collector()
            except Exception:  # a broken collector must not stop the flushes
                if index not in self._failed_collectors:
                    self._failed_collectors.add(index)
                    log.exception("dsec collector %r failed; it keeps being called", collector)

    def _check_losses(self) -> None:
        """Reads the losses of the steps between samples, all at once; a NaN/Inf one
        becomes a sample of its own (no gradient norm: its gradients are gone by now)."""
        checks = self._loss_checks
        taken: list[tuple[int, Any]] = []
        while checks:
            try:
                taken.append(checks.popleft())
            except IndexError:
                break
        if not taken:
            return
        try:
            flags = nonfinite_flags([loss for _step, loss in taken])
        except Exception:  # not numbers after all: nothing to report
            self._warn_once("loss_check", "dsec: losses could not be read")
            return
        for (step, loss), bad in zip(taken, flags, strict=True):
            if bad:
                self._record(("step", now_ms(), step, loss, None, None, None))

    def _flush_once(self, force_heartbeat: bool = False) -> None:
        self._transport.poll()
        self._check_losses()
        self._run_collectors()
        self.wake()  # the step callbacks run at least once a flush interval
        while self._send_chunk():
            pass
        now_s = time.monotonic()
        if force_heartbeat or now_s - self._last_heartbeat_s >= self.config.heartbeat_interval_s:
            # after the backlog went out, so the heartbeat finds room and fresh counts
            self._last_heartbeat_s = now_s
            self._append_heartbeat()
            while self._send_chunk():
                pass

    def _send_chunk(self) -> bool:
        """Hands the oldest samples, one message's worth, to the transport.

        False when nothing is left or the transport refused (its queue is full): the chunk
        goes back to the front of the buffer, where the bound kept room for it.
        """
        limit = self.config.max_samples_per_message
        with self._lock:
            batch = self._pending[:limit]
            del self._pending[:limit]
            count = len(batch)
            self._in_flight += count
            self._reserved += count
        if not batch:
            return False

        def on_delivery(delivered: bool, error: str) -> None:
            with self._lock:
                self._in_flight -= count
                if delivered:
                    self._sent += count
                else:
                    self._dropped += count
                    self._messages_failed += 1
            if not delivered:
                log.warning("dsec: %d samples lost: %s", count, error)

        try:
            value = self._encode(batch)
            accepted = self._transport.send(self._topic, self._key, value, on_delivery)
        except Exception:  # unencodable or unsendable: this chunk is lost, and counted
            log.exception("dsec: %d samples could not be sent", count)
            with self._lock:
                self._in_flight -= count
                self._reserved -= count
                self._dropped += count
                self._messages_failed += 1
            return True
        with self._lock:
            self._reserved -= count
            if not accepted:
                self._in_flight -= count
                self._pending[:0] = batch
        return accepted

    def _next_message_number(self) -> int:
        self._messages_encoded += 1
        return self._messages_encoded

    def _encode(self, batch: list[tuple]) -> bytes:
        return orjson.dumps({
            "schema_version": SCHEMA_VERSION,
            "event_id": f"{self._id_prefix}{self._next_message_number():016x}",
            "event_time_ms": now_ms(),
            "identity": self._identity_fields,
            "columns": pack_long_columns(batch_columns(batch)),
        })

    def publish(self, topic: str, key: bytes, value: bytes) -> None:
        """Sends a message of another kind (an actuation result) through the probe's producer."""

        def on_delivery(delivered: bool, error: str) -> None:
            if not delivered:
                with self._lock:
                    self._messages_failed += 1
                log.warning("dsec: message to %s lost: %s", topic, error)

        if not self._transport.send(topic, key, value, on_delivery):
            with self._lock:
                self._messages_failed += 1

    def shutdown(self) -> ProbeCounters:
        """Stops the thread, sends what is buffered, waits for delivery (bounded)."""
        self.unwatch()
        if self._thread is not None:
            self._stop.set()
            self._flush_soon.set()
            self._thread.join()
            self._thread = None
        self._transport.flush(self.config.shutdown_flush_timeout_s)
        self._transport.close()
        return self.counters()
