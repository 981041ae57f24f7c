"""The PPO worker's asynchronous sampling thread: collects one rollout per request, and
waits at the sampler gate before each, so that a pause command parks it while the
training thread (its step boundaries, its data-parallel group, the probe's heartbeat)
goes on.

Rollouts are collected one at a time, with the weights of the last update (the training
thread requests the next once it has stepped), so PPO stays on-policy as in a serial
loop; a lock keeps the two threads from touching the weights at once.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

Batch = TypeVar("Batch")

GATE_POLL_S = 0.05


class Gate(Protocol):
    def wait_until_running(self, timeout_s: float | None = None) -> bool: ...


class RolloutSampler(Generic[Batch]):
    def __init__(self, collect: Callable[[], Batch], gate: Gate,
                 on_error: Callable[[BaseException], None]) -> None:
        """``collect`` runs on the sampling thread; ``on_error`` hears what it raised (the
        thread ends after it)."""
        self._collect = collect
        self._gate = gate
        self._on_error = on_error
        self.weights = threading.Lock()  # held while collecting and while training
        self._requested = threading.Event()
        self._ready: queue.Queue[Batch] = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._parked = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ppo-sampler", daemon=True)

    @property
    def parked(self) -> bool:
        """A rollout is asked for and the thread waits at the gate (the sampler paused)."""
        return self._parked.is_set()

    def start(self) -> RolloutSampler[Batch]:
        self._thread.start()
        return self

    def request(self) -> None:
        """Collect the next rollout, with the weights as they are now."""
        self._requested.set()

    def take(self, timeout_s: float) -> Batch | None:
        try:
            return self._ready.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def discard(self) -> None:
        """Drops a rollout collected with weights the training thread has since replaced
        (a resume from a snapshot), and any request outstanding."""
        with self.weights:
            self._requested.clear()
            while self.take(0.0) is not None:
                pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._requested.wait(GATE_POLL_S):
                    continue
                if not self._gate.wait_until_running(GATE_POLL_S):
                    self._parked.set()
                    continue
                self._parked.clear()
                with self.weights:
                    if not self._requested.is_set():
                        continue  # discarded while the gate was passed
                    batch = self._collect()
                    self._requested.clear()
                self._ready.put(batch)
        except BaseException as exc:  # the worker decides what a failed rollout means
            self._on_error(exc)
