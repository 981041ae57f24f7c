"""Probes inside a training worker: health samples batched to Kafka without blocking the step.

Also the HTTP ingest gateway (``gateway*``), the same path for runtimes that are not Python.
"""

from dsec.ingest.config import ProbeConfig
from dsec.ingest.probe import Probe, ProbeCounters
from dsec.ingest.transport import KafkaTransport, Transport

__all__ = ["KafkaTransport", "Probe", "ProbeConfig", "ProbeCounters", "Transport"]
