"""Recorded or synthetic metric traces (JSON lines of ``MetricBatch``) back onto the metrics
topic, keeping their relative timing at a chosen speed."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
from confluent_kafka import Producer

from dsec.schemas.units import ms_to_s


@dataclass
class ReplayCounters:
    published: int = 0
    unreadable_lines: int = 0


def read_lines(path: Path) -> Iterator[bytes]:
    with path.open("rb") as handle:
        for line in handle:
            line = line.strip()
            if line:
                yield line


def _key_and_time(line: bytes) -> tuple[bytes, int | None]:
    document = orjson.loads(line)
    identity = document.get("identity") or {}
    worker = identity.get("worker_id") if isinstance(identity, dict) else None
    event_time = document.get("event_time_ms")
    return (str(worker).encode() if worker else b"replay",
            event_time if isinstance(event_time, int) else None)


def replay(
    lines: Iterable[bytes], producer: Producer, topic: str, speed: float,
    sleep=time.sleep, clock=time.monotonic,
) -> ReplayCounters:
    """Publishes each line as one message, keyed by its worker; ``speed`` 0 means at once.

    Lines are published as they are (a malformed batch is the stream job's to dead-letter);
    only lines that are not JSON objects are skipped and counted.
    """
    counters = ReplayCounters()
    first_event_ms: int | None = None
    started = clock()
    for line in lines:
        try:
            key, event_time_ms = _key_and_time(line)
        except (orjson.JSONDecodeError, AttributeError):
            counters.unreadable_lines += 1
            continue
        if speed > 0 and event_time_ms is not None:
            if first_event_ms is None:
                first_event_ms = event_time_ms
            due = started + ms_to_s(event_time_ms - first_event_ms) / speed
            delay = due - clock()
            if delay > 0:
                sleep(delay)
        while True:
            try:
                producer.produce(topic, key=key, value=line)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
        counters.published += 1
    return counters
