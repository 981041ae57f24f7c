"""The probe: records health samples from the training thread and ships them off it.

The training thread only appends small tuples to a bounded buffer (one lock, no
I/O, no device sync). A background thread turns them into one ``MetricBatch``
message per flush interval, adds the heartbeat, and hands it to the transport.
Every sample that cannot be kept is counted and reported in the next heartbeat.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from dsec.ingest.config import ProbeConfig
from dsec.ingest.sampling import norm_interval_steps, smoothed
from dsec.ingest.transport import Transport
from dsec.schemas import SCHEMA_VERSION, WorkerIdentity, new_event_id, now_ms
from dsec.schemas.metrics import columns_from_rows, pack_columns

log = logging.getLogger(__name__)

StepCallback = Callable[[], None]
Collector = Callable[[], None]


@dataclass(frozen=True)
class ProbeCounters:
    samples_recorded: int
    samples_sent: int
    samples_buffered: int
    samples_dropped: int
    messages_failed: int


def _as_float(value: Any) -> float | None:
    if value is None:
        return None
    return float(value.item() if hasattr(value, "item") else value)


def _finite_or_flag(value: Any) -> tuple[float | None, bool]:
    number = _as_float(value)
    if number is None:
        return None, False
    if math.isfinite(number):
        return number, False
    return None, True


def nonfinite_on_host(value: Any) -> bool:
    """True when ``value`` is a NaN/Inf that can be read without a device sync: a number,
    or a one-element CPU tensor (a microsecond). A device tensor is not read: it is checked
    on sampled steps only, off the training thread."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if not getattr(value, "is_cpu", False) or value.numel() != 1:  # ``.device``: 10x slower
        return False
    return not math.isfinite(value.item())


def total_grad_norm(optimizer: Any) -> Any:
    """L2 norm of every gradient the optimizer holds, as a tensor (no device sync), or None.

    One fused ``_foreach_norm`` per device; per-device results meet on the first device.
    """
    import torch

    grads = [
        p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None
    ]
    if not grads:
        return None
    with torch.no_grad():
        norms = torch._foreach_norm(grads)
        device = norms[0].device
        return torch.linalg.vector_norm(torch.stack([n.to(device) for n in norms]))


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
        self._last_grad_norm: Any = None
        self._grad_norm_from_trainer = False
        self._force_sample = False  # a non-finite loss seen on a step not due for a sample
        self._last_sample_s: float | None = None
        self._last_sample_step = 0
        self._step_every = self.config.step_sample_every_n_steps
        self._adaptive_norms = self.config.grad_norm_every_n_steps is None
        # steps between two gradient norms: fixed, or (adaptive) 10 until measured
        self._norm_interval = self.config.grad_norm_every_n_steps or 10
        self._next_norm_step = 0
        self._norm_cost_s: float | None = None  # smoothed, on the training thread
        self._norms_timed = 0
        self._step_time_s: float | None = None  # smoothed, from the step samples
        self._step_callbacks: list[StepCallback] = []
        self._collectors: list[Collector] = []
        self._failed_collectors: set[int] = set()
        self._warned: set[str] = set()
        self._hook_handles: list[Any] = []
        self._stop = threading.Event()
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
        self.run_step_callbacks()

    def _sampled(self, step: int) -> bool:
        return (self._force_sample or step % self._step_every == 0
                or step >= self._next_norm_step)

    @property
    def grad_norm_interval_steps(self) -> int:
        """Steps between two gradient norms, as the probe spaces them now."""
        return self._norm_interval

    def _norm_costs(self, cost_s: float) -> None:
        """One norm's cost on the training thread: the interval follows it (adaptive). The
        first norm is not counted: it pays for torch's first call of the kernels."""
        self._norms_timed += 1
        if self._norms_timed == 1:
            return
        self._norm_cost_s = smoothed(self._norm_cost_s, cost_s)
        if self._adaptive_norms and self._step_time_s:
            self._norm_interval = norm_interval_steps(
                self._norm_cost_s, self._step_time_s, self.config.grad_norm_budget_fraction,
                self.config.grad_norm_max_interval_steps)

    def note_loss(self, loss: Any) -> None:
        """Keeps the loss for this step's sample; a tensor is read off the training thread.
        On a step not due for a sample, a host-side loss is still checked: a NaN/Inf makes
        the step sampled (gradient norm included), so a NaN burst is never missed on CPU."""
        if not self._sampled(self._global_step):
            if not nonfinite_on_host(loss):
                return
            self._force_sample = True
        self._last_loss = loss.detach() if hasattr(loss, "detach") else loss

    def note_grad_norm(self, total_norm: Any) -> None:
        """The total gradient norm the trainer already has (``clip_grad_norm_`` returns it):
        the probe uses it for this step instead of computing its own."""
        if total_norm is None or not self._sampled(self._global_step):
            return
        self._last_grad_norm = total_norm.detach() if hasattr(total_norm, "detach") else total_norm
        self._grad_norm_from_trainer = True

    def record_step(self, loss: Any = None, grad_norm: Any = None) -> None:
        """One optimizer step; called by the optimizer hook or by a custom loop.

        A sample is recorded every ``step_sample_every_n_steps`` steps and on every step whose
        gradient norm is computed; other steps only count (the hot path stays a few
        microseconds). The sample's step time is the mean since the previous sample. A
        host-side loss is checked on every step, as ``note_loss`` does: a NaN/Inf makes the
        step a sample.
        """
        if loss is not None and nonfinite_on_host(loss):
            self._force_sample = True
        step = self._global_step
        self._global_step = step + 1
        if not self._sampled(step):
            if self._step_callbacks:
                self.run_step_callbacks()
            return
        now_s = time.perf_counter()
        step_time_ms = None
        if self._last_sample_s is not None and step > self._last_sample_step:
            step_time_ms = (now_s - self._last_sample_s) * 1000.0 / (step - self._last_sample_step)
            self._step_time_s = smoothed(self._step_time_s, step_time_ms / 1000.0)
        if step >= self._next_norm_step:  # this step was the norm's turn
            self._next_norm_step = step + self._norm_interval
        self._last_sample_s = now_s
        self._last_sample_step = step
        loss = loss if loss is not None else self._last_loss
        from_trainer = self._grad_norm_from_trainer or grad_norm is not None
        grad_norm = grad_norm if grad_norm is not None else self._last_grad_norm
        self._last_loss = None
        self._last_grad_norm = None
        self._grad_norm_from_trainer = False
        self._force_sample = False
        source = None if grad_norm is None else ("trainer" if from_trainer else "probe")
        self._record(("step", now_ms(), step, loss, grad_norm, step_time_ms, source))
        self.run_step_callbacks()

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
        """Runs ``callback`` on the training thread at every step and episode boundary."""
        self._step_callbacks.append(callback)

    def run_step_callbacks(self) -> None:
        for callback in self._step_callbacks:
            try:
                callback()
            except Exception:  # telemetry never crashes the training loop
                log.exception("dsec step callback failed")

    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.exception(message)

    def watch(self, optimizer: Any) -> None:
        """Hooks an optimizer: gradient L2 norm before each step, a step sample after it."""
        def before_step(opt: Any, _args: Any, _kwargs: Any) -> None:
            if ((self._global_step < self._next_norm_step and not self._force_sample)
                    or self._grad_norm_from_trainer):
                return  # not this step's turn, or the trainer gave its norm
            try:
                started_s = time.perf_counter()
                self._last_grad_norm = total_grad_norm(opt)
                self._norm_costs(time.perf_counter() - started_s)
            except Exception:  # sparse or unusual gradients: no norm, and training goes on
                self._warn_once("grad_norm", "dsec: gradient norm not computed")

        def after_step(_opt: Any, _args: Any, _kwargs: Any) -> None:
            try:
                self.record_step()
            except Exception:
                self._warn_once("record_step", "dsec: step not recorded")

        self._hook_handles.append(optimizer.register_step_pre_hook(before_step))
        self._hook_handles.append(optimizer.register_step_post_hook(after_step))

    def unwatch(self) -> None:
        """Removes the optimizer hooks (the probe keeps running)."""
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles.clear()

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
        while not self._stop.wait(interval_s):
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

    def _flush_once(self, force_heartbeat: bool = False) -> None:
        self._transport.poll()
        self._run_collectors()
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

    def _encode(self, batch: list[tuple]) -> bytes:
        batch_id = new_event_id()
        samples = [self._sample_dict(batch_id, index, raw) for index, raw in enumerate(batch)]
        message = {
            "schema_version": SCHEMA_VERSION,
            "event_id": batch_id,
            "event_time_ms": now_ms(),
            "identity": self.identity.model_dump(),
            # Packed columns: a fraction of the bytes of rows, and what the stream jobs read
            # fastest.
            "columns": pack_columns(columns_from_rows(samples)),
        }
        return orjson.dumps(message)

    @staticmethod
    def _sample_dict(batch_id: str, index: int, raw: tuple) -> dict:
        kind, event_time_ms = raw[0], raw[1]
        sample: dict[str, Any] = {
            "event_id": f"{batch_id}-{index}",
            "event_time_ms": event_time_ms,
            "kind": kind,
        }
        if kind == "step":
            _, _, step, loss, grad_norm, step_time_ms, source = raw
            loss_value, loss_nonfinite = _finite_or_flag(loss)
            norm_value, grad_nonfinite = _finite_or_flag(grad_norm)
            sample.update(step=step, loss_nonfinite=loss_nonfinite, grad_nonfinite=grad_nonfinite)
            if loss_value is not None:
                sample["loss"] = loss_value
            if norm_value is not None:
                sample["grad_norm"] = norm_value
            if source is not None:
                sample["grad_norm_source"] = source
            if step_time_ms is not None:
                sample["step_time_ms"] = step_time_ms
        elif kind == "episode":
            _, _, index_, reward, length, terminated, truncated, reason = raw
            sample.update(
                episode_index=index_, reward=float(reward), length=int(length),
                terminated=terminated, truncated=truncated,
            )
            if reason is not None:
                sample["termination_reason"] = str(reason)[:256]
        elif kind == "heartbeat":
            _, _, interval_s, step, sent, buffered, dropped, recorded, failed = raw
            sample.update(
                interval_s=interval_s, step=step, samples_sent=sent,
                samples_buffered=buffered, samples_dropped=dropped,
                samples_recorded=recorded, messages_failed=failed,
            )
        elif kind == "grad_sync":
            _, _, step, nbytes, latency_ms, ok, op, timer, error = raw
            sample.update(step=step, bytes=int(nbytes), latency_ms=max(0.0, float(latency_ms)),
                          ok=ok, op=op[:64], timer=timer)
            if error:
                sample["error"] = error[:256]
        elif kind == "fields":
            sample["kind"] = raw[2]
            sample.update(raw[3])
        return sample

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
            self._thread.join()
            self._thread = None
        self._transport.flush(self.config.shutdown_flush_timeout_s)
        return self.counters()
