"""When the probe flushes: a background thread that flushes every flush interval, sooner
when asked (a NaN/Inf sample), and once more when stopped."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from dsec.ingest.clock import Clock

log = logging.getLogger(__name__)

# The shortest time between two flushes when NaN/Inf samples ask for them sooner.
URGENT_GAP_S = 0.02

FlushFn = Callable[[bool], None]  # (force_heartbeat) -> None


def urgent_wait_s(interval_s: float, since_flush_s: float, gap_s: float = URGENT_GAP_S) -> float:
    """How long a flush asked for early still waits: at most one early flush per ``gap_s``
    (never more than the interval), so a loss that is NaN on every step does not turn into
    a message per step. Zero or less: flush now."""
    return min(interval_s, gap_s) - since_flush_s


class FlushThread:
    def __init__(self, flush: FlushFn, interval_s: float, clock: Clock) -> None:
        self._flush = flush
        self._interval_s = interval_s
        self._clock = clock
        self._stop = threading.Event()
        self._soon = threading.Event()
        self._thread: threading.Thread | None = None
        # the training thread's way to ask for a flush now: the event's own method, no call
        # of ours in between
        self.flush_soon: Callable[[], None] = self._soon.set

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="dsec-probe", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ends the thread after one last flush, heartbeat included; waits for it."""
        if self._thread is None:
            return
        self._stop.set()
        self._soon.set()
        self._thread.join()
        self._thread = None

    def _run(self) -> None:
        interval_s = self._interval_s
        flushed_s = self._clock.monotonic_s()
        while True:
            self._soon.wait(interval_s)
            self._soon.clear()
            if self._stop.is_set():
                break
            wait_s = urgent_wait_s(interval_s, self._clock.monotonic_s() - flushed_s)
            if wait_s > 0 and self._stop.wait(wait_s):
                break
            flushed_s = self._clock.monotonic_s()
            self._flush_safely(False)
        self._flush_safely(True)

    def _flush_safely(self, force_heartbeat: bool) -> None:
        try:
            self._flush(force_heartbeat)
        except Exception:  # the thread outlives any one bad flush
            log.exception("dsec: flush failed")
