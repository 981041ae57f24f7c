"""In-memory seams shared by the probe tests."""

from __future__ import annotations

import threading

from dsec.ingest import Probe, ProbeConfig
from dsec.ingest.clock import Clock, ManualClock
from dsec.schemas import MetricBatch, WorkerIdentity, decode

IDENTITY = WorkerIdentity(job_id="job", worker_id="w0", node_id="n0")


class RecordingTransport:
    """Keeps messages in memory; ``accepting=False`` behaves as a full local queue."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, bytes, bytes]] = []
        self.accepting = True
        self.deliver = True
        self._callbacks: list = []
        self.lock = threading.Lock()

        self._sent = threading.Condition(self.lock)

    def send(self, topic, key, value, on_delivery) -> bool:
        if not self.accepting:
            return False
        with self.lock:
            self.messages.append((topic, key, value))
            self._callbacks.append(on_delivery)
            self._sent.notify_all()
        return True

    def wait_for_messages(self, count: int, timeout_s: float) -> bool:
        """Waits (woken by each send, no polling) until at least ``count`` messages came."""
        with self._sent:
            return self._sent.wait_for(lambda: len(self.messages) >= count, timeout_s)

    def poll(self) -> None:
        with self.lock:
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self.deliver, "" if self.deliver else "broker away")

    def flush(self, timeout_s: float) -> int:
        self.poll()
        return 0

    def close(self) -> None:
        self.poll()

    def batches(self) -> list[MetricBatch]:
        return [decode(value, MetricBatch) for _topic, _key, value in self.messages]

    def samples(self, kind: str | None = None) -> list:
        return [s for b in self.batches() for s in b.rows() if kind is None or s.kind == kind]


def manual_probe(transport: RecordingTransport, clock: Clock | None = None,
                 **config: object) -> Probe:
    """A probe whose flushes the test makes by hand (``probe.flush()``), on a clock that
    moves only when the test moves it (a fresh ``ManualClock`` unless given)."""
    defaults = {"flush_interval_s": 60, "heartbeat_interval_s": 3600,
                "step_sample_every_n_steps": 1}
    return Probe(IDENTITY, "metrics", transport, ProbeConfig(**{**defaults, **config}),
                 clock=clock or ManualClock())
