"""The probe's bounded sample buffer and its accounting: every sample recorded ends up sent,
dropped, or still held, and the counts say which.

Recording takes one lock and appends a tuple (no I/O, no device sync), from any thread.
The flusher takes the oldest samples a message's worth at a time; a chunk out for sending
keeps its place against the bound, so a chunk the transport refuses always fits back.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class ProbeCounters:
    samples_recorded: int
    samples_sent: int
    samples_buffered: int
    samples_dropped: int
    messages_failed: int


class SampleBuffer:
    def __init__(self, max_samples: int) -> None:
        self._max_samples = max_samples
        self._lock = threading.Lock()
        self._pending: list[tuple] = []
        self._in_flight = 0  # handed to the transport, delivery not yet known
        self._reserved = 0  # taken for sending, the transport not yet asked
        self._recorded = 0
        self._sent = 0
        self._dropped = 0
        self._messages_failed = 0

    def record(self, sample: tuple) -> None:
        """Keeps ``sample``, or drops and counts it when the buffer is full; any thread."""
        with self._lock:
            self._recorded += 1
            if len(self._pending) + self._reserved >= self._max_samples:
                self._dropped += 1
                return
            self._pending.append(sample)

    def record_heartbeat(self, event_time_ms: int, interval_s: float, global_step: int) -> None:
        """The heartbeat is a sample too: kept or dropped like any other, and the next one
        that gets through carries the totals, itself included."""
        with self._lock:
            self._recorded += 1
            if len(self._pending) + self._reserved >= self._max_samples:
                self._dropped += 1
                return
            self._pending.append((
                "heartbeat", event_time_ms, interval_s, global_step, self._sent,
                len(self._pending) + self._in_flight, self._dropped, self._recorded,
                self._messages_failed,
            ))

    def take(self, max_samples: int) -> list[tuple]:
        """The oldest samples, up to ``max_samples``, reserved for one message: each must
        be followed by ``handed_over`` or ``lost``."""
        with self._lock:
            chunk = self._pending[:max_samples]
            del self._pending[:max_samples]
            self._in_flight += len(chunk)
            self._reserved += len(chunk)
        return chunk

    def handed_over(self, chunk: list[tuple], accepted: bool) -> None:
        """The transport took ``chunk`` (its delivery comes later), or refused it: then it
        goes back to the front, in order."""
        with self._lock:
            self._reserved -= len(chunk)
            if not accepted:
                self._in_flight -= len(chunk)
                self._pending[:0] = chunk

    def lost(self, count: int) -> None:
        """A taken chunk of ``count`` samples could not be encoded or sent."""
        with self._lock:
            self._in_flight -= count
            self._reserved -= count
            self._dropped += count
            self._messages_failed += 1

    def delivered(self, count: int, ok: bool) -> None:
        """The transport's report on a chunk of ``count`` samples it took."""
        with self._lock:
            self._in_flight -= count
            if ok:
                self._sent += count
            else:
                self._dropped += count
                self._messages_failed += 1

    def message_failed(self) -> None:
        """A message of another kind sent through the probe's transport was lost."""
        with self._lock:
            self._messages_failed += 1

    def counters(self) -> ProbeCounters:
        with self._lock:
            return ProbeCounters(
                samples_recorded=self._recorded,
                samples_sent=self._sent,
                samples_buffered=len(self._pending) + self._in_flight,
                samples_dropped=self._dropped,
                messages_failed=self._messages_failed,
            )
