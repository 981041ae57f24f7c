"""In-memory seams shared by the probe tests."""

from __future__ import annotations

import threading

from dsec.ingest import Probe, ProbeConfig
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

    def send(self, topic, key, value, on_delivery) -> bool:
        if not self.accepting:
            return False
        with self.lock:
            self.messages.append((topic, key, value))
            self._callbacks.append(on_delivery)
        return True

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


def manual_probe(transport: RecordingTransport, **config: object) -> Probe:
    """A probe whose flushes the test makes by hand."""
    defaults = {"flush_interval_s": 60, "heartbeat_interval_s": 3600,
                "step_sample_every_n_steps": 1}
    return Probe(IDENTITY, "metrics", transport, ProbeConfig(**{**defaults, **config}))
