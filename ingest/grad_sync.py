"""Gradient-synchronisation timing: bytes, latency and outcome of every all-reduce.

``torch.distributed.all_reduce`` is wrapped in place; DDP's bucket all-reduce is timed by
a communication hook. Wall clock on CPU (gloo); CUDA events on GPU, read on the probe's
thread once the GPU has passed them, so the training thread never waits for the device.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from dsec.schemas.units import duration_ms

log = logging.getLogger(__name__)

ALL_REDUCE_OP = "all_reduce"
DDP_BUCKET_OP = "ddp_bucket_all_reduce"
_MAX_PENDING_CUDA_TIMINGS = 10_000


class GradSyncSink(Protocol):
    @property
    def global_step(self) -> int: ...

    def record_grad_sync(
        self, step: int, nbytes: int, latency_ms: float, ok: bool, op: str,
        timer: str = "wall_clock", error: str | None = None,
    ) -> None: ...


@dataclass
class _Timing:
    step: int
    nbytes: int
    op: str
    started_s: float
    start_event: Any = None  # torch.cuda.Event when the tensor is on a GPU


def tensor_nbytes(tensor: Any) -> int:
    try:
        return int(tensor.numel()) * int(tensor.element_size())
    except Exception:
        return 0


class GradSyncTimer:
    """Turns begin/end pairs into ``grad_sync`` samples; safe from any thread."""

    def __init__(self, sink: GradSyncSink) -> None:
        self._sink = sink
        self._pending_cuda: deque[tuple[_Timing, Any, bool, str | None]] = deque()
        self._lock = threading.Lock()
        self.cuda_timings_dropped = 0

    def begin(self, tensor: Any, op: str) -> _Timing | None:
        """Starts timing one sync; None (and no sample) if even that fails."""
        try:
            timing = _Timing(
                self._sink.global_step, tensor_nbytes(tensor), op, time.perf_counter()
            )
            if getattr(tensor, "is_cuda", False):
                import torch

                timing.start_event = torch.cuda.Event(enable_timing=True)
                timing.start_event.record()
            return timing
        except Exception:  # timing is telemetry: the sync itself must go ahead
            log.exception("dsec: could not time a gradient sync")
            return None

    def end(self, timing: _Timing | None, ok: bool, error: BaseException | None = None) -> None:
        if timing is None:
            return
        try:
            self._end(timing, ok, error)
        except Exception:
            log.exception("dsec: could not record a gradient sync")

    def _end(self, timing: _Timing, ok: bool, error: BaseException | None) -> None:
        error_text = None if error is None else f"{type(error).__name__}: {error}"
        if timing.start_event is not None and ok:
            import torch

            end_event = torch.cuda.Event(enable_timing=True)
            end_event.record()
            with self._lock:
                if len(self._pending_cuda) >= _MAX_PENDING_CUDA_TIMINGS:
                    self.cuda_timings_dropped += 1
                    return
                self._pending_cuda.append((timing, end_event, ok, error_text))
            return
        latency_ms = duration_ms(time.perf_counter() - timing.started_s)
        self._sink.record_grad_sync(
            timing.step, timing.nbytes, latency_ms, ok, timing.op, "wall_clock", error_text
        )

    def collect(self) -> None:
        """Reads the CUDA timings the GPU has finished (the probe's thread calls this)."""
        while True:
            with self._lock:
                if not self._pending_cuda or not self._pending_cuda[0][1].query():
                    return
                timing, end_event, ok, error_text = self._pending_cuda.popleft()
            latency_ms = float(timing.start_event.elapsed_time(end_event))
            self._sink.record_grad_sync(
                timing.step, timing.nbytes, latency_ms, ok, timing.op, "cuda_event", error_text
            )


_suppressed = threading.local()


def _is_suppressed() -> bool:
    return getattr(_suppressed, "active", False)


class _Suppress:
    """While a DDP hook runs its own all-reduce, the wrapped ``all_reduce`` stays quiet."""

    def __enter__(self) -> None:
        self._before = _is_suppressed()
        _suppressed.active = True

    def __exit__(self, *exc: object) -> None:
        _suppressed.active = self._before


def _watch_async(timer: GradSyncTimer, timing: _Timing | None, work: Any) -> None:
    if timing is None:
        return
    try:
        future = work.get_future()
    except Exception:  # a backend without futures: the enqueue time is all there is
        timer.end(timing, ok=True)
        return

    def done(fut: Any) -> None:
        try:
            fut.value()
        except Exception as exc:
            timer.end(timing, ok=False, error=exc)
        else:
            timer.end(timing, ok=True)

    future.add_done_callback(done)


def instrument_all_reduce(timer: GradSyncTimer) -> Callable[[], None]:
    """Wraps ``torch.distributed.all_reduce``; returns the function that undoes it.

    Code that imported ``all_reduce`` by name before this call keeps the original.
    """
    import torch.distributed as dist

    original = dist.all_reduce
    if getattr(original, "__dsec_timed__", False):
        return lambda: None

    @functools.wraps(original)
    def all_reduce(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if _is_suppressed():
            return original(tensor, *args, **kwargs)
        timing = timer.begin(tensor, ALL_REDUCE_OP)
        try:
            work = original(tensor, *args, **kwargs)
        except Exception as exc:
            timer.end(timing, ok=False, error=exc)
            raise
        if work is None:
            timer.end(timing, ok=True)
        else:
            _watch_async(timer, timing, work)
        return work

    all_reduce.__dsec_timed__ = True  # type: ignore[attr-defined]
    dist.all_reduce = all_reduce

    def undo() -> None:
        if dist.all_reduce is all_reduce:
            dist.all_reduce = original

    return undo


CommHook = Callable[[Any, Any], Any]


def timed_comm_hook(timer: GradSyncTimer, inner: CommHook | None = None) -> CommHook:
    """A DDP communication hook timing ``inner`` (default: DDP's plain all-reduce) per bucket.

    Register it with ``ddp_model.register_comm_hook(state, hook)``; ``state`` goes to ``inner``
    (for the default all-reduce: the process group, or None for the default group).
    """
    if inner is None:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        inner = allreduce_hook

    def hook(state: Any, bucket: Any) -> Any:
        timing = timer.begin(bucket.buffer(), DDP_BUCKET_OP)
        try:
            with _Suppress():
                future = inner(state, bucket)
        except Exception as exc:
            timer.end(timing, ok=False, error=exc)
            raise

        def done(fut: Any) -> Any:
            try:
                result = fut.value()
            except Exception as exc:
                timer.end(timing, ok=False, error=exc)
                raise
            timer.end(timing, ok=True)
            return result

        return future.then(done)

    # DDP checks annotations against its own types; this module's are strings.
    hook.__annotations__ = {}
    return hook
