"""Sampler pause/resume: a flag the loop's async sampling thread honours."""

from __future__ import annotations

import threading

from dsec.schemas.actuations import SamplerParams


class SamplerGate:
    """Paused means the sampling thread waits; the inference thread (and with it the
    environment heartbeat) keeps running, as the circuit breaker intends."""

    def __init__(self) -> None:
        self._running = threading.Event()
        self._running.set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    def wait_until_running(self, timeout_s: float | None = None) -> bool:
        """Call from the sampling thread before each batch; False if still paused."""
        return self._running.wait(timeout_s)

    def apply(self, params: SamplerParams) -> str:
        if params.paused:
            self._running.clear()
            return "sampler paused"
        self._running.set()
        return "sampler resumed"
