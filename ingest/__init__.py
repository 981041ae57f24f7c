"""Probes inside a training worker: health samples batched to Kafka (or, in endpoint mode,
to the HTTP ingest gateway) without blocking the step.

Also the HTTP ingest gateway (``gateway*``), the same path for runtimes that are not Python,
and the C probe library (``native/``).
"""

from dsec.ingest.config import ProbeConfig
from dsec.ingest.http_transport import HttpTransport
from dsec.ingest.probe import Probe, ProbeCounters
from dsec.ingest.transport import KafkaTransport, Transport

__all__ = ["HttpTransport", "KafkaTransport", "Probe", "ProbeConfig", "ProbeCounters",
           "Transport"]
