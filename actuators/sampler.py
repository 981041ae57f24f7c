"""Sampler pause/resume: a gate the loop's asynchronous sampling thread waits at."""

from __future__ import annotations

import threading

from dsec.actuators.effects import Effect, Pending
from dsec.actuators.loop_setting import LoopSetting
from dsec.schemas.actuations import SamplerParams


class SamplerGate(LoopSetting[bool]):
    """Paused means the sampling thread waits; the inference thread (and with it the
    environment heartbeat) keeps running, as the circuit breaker intends.

    A sampling thread registers by waiting at the gate before each batch
    (``wait_until_running``); what it met there is the state in force: a pause is applied
    once the thread is parked at the gate, a resume once it has passed it."""

    what = "sampler paused"
    unattached = "no sampling thread waits at the sampler gate"
    attach_hint = ("call dsec.controls().sampler.wait_until_running() in the sampling "
                   "thread before each batch")

    def __init__(self) -> None:
        super().__init__(False)
        self._running = threading.Event()
        self._running.set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    def wait_until_running(self, timeout_s: float | None = None) -> bool:
        """Call from the sampling thread before each batch; False if still paused."""
        if self._running.is_set():
            self.take(False)
            return True
        self.take(True)  # parked: the pause is in force
        if not self._running.wait(timeout_s):
            return False
        self.take(False)
        return True

    def apply(self, params: SamplerParams) -> Effect | Pending:
        if params.paused:
            self._running.clear()
        else:
            self._running.set()
        return self.request(params.paused)

    def _taken_up(self, target: bool) -> bool:
        return self.in_force == target

    def applied_detail(self, previous: bool, target: bool) -> str:
        return ("sampler paused: the sampling thread waits at the gate" if target
                else "sampler resumed: the sampling thread passed the gate")
