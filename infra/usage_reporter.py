"""A service process's own cost: its CPU time and resident memory, published every
``interval_s`` as ``ProcessUsage`` events (the sink stores them; ``dsec report cost``
reads them as the control plane's hidden cost). Telemetry never stops the service: a
reading that cannot be sent is dropped and logged."""

from __future__ import annotations

import logging
import os
import resource
import socket
import threading
from collections.abc import Callable

from confluent_kafka import Producer

from dsec.schemas import encode, now_ms
from dsec.schemas.usage import ProcessUsage

__all__ = ["UsageReporter", "read_usage"]

log = logging.getLogger(__name__)


def _rss_bytes() -> int:
    """Resident memory now (Linux: /proc/self/statm), else the peak the kernel reports."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def read_usage(service: str, started_at_ms: int) -> ProcessUsage:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    host = "".join(c if c.isalnum() or c in "_.:-/" else "-" for c in socket.gethostname())
    return ProcessUsage(service=service, host=host or "unknown", pid=os.getpid(),
                        started_at_ms=started_at_ms, cpu_s=usage.ru_utime + usage.ru_stime,
                        rss_bytes=_rss_bytes())


class UsageReporter:
    def __init__(self, producer_config: dict, topic: str, service: str, interval_s: float,
                 read: Callable[[str, int], ProcessUsage] = read_usage) -> None:
        self._producer = Producer(producer_config)
        self._topic = topic
        self._service = service
        self._interval_s = interval_s
        self._read = read
        self._started_at_ms = now_ms()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sent = 0

    def start(self) -> UsageReporter:
        self._thread = threading.Thread(target=self._run, name="dsec-usage", daemon=True)
        self._thread.start()
        return self

    def report(self) -> None:
        """One reading, handed to the producer."""
        try:
            usage = self._read(self._service, self._started_at_ms)
            self._producer.produce(self._topic, key=f"{self._service}/{usage.host}".encode(),
                                   value=encode(usage))
            self._producer.poll(0)
            self.sent += 1
        except Exception:  # telemetry must not stop the service
            log.exception("process usage not reported")

    def _run(self) -> None:
        self.report()
        while not self._stop.wait(self._interval_s):
            self.report()

    def stop(self, timeout_s: float = 5.0) -> None:
        """A last reading (the CPU time up to now), delivered within ``timeout_s``."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.report()
        self._producer.flush(timeout_s)
