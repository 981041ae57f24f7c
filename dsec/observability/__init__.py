"""Observability of dsec's own services: Prometheus metrics and health, served by each
process on ``/metrics`` and ``/healthz``."""

from dsec.observability.metrics import (
    CATALOGUE,
    METRIC_NAMES,
    SERVICE_METRICS,
    MetricSpec,
    ProcessMetrics,
)
from dsec.observability.server import MetricsServer, check_health, serve_metrics

__all__ = [
    "CATALOGUE",
    "METRIC_NAMES",
    "SERVICE_METRICS",
    "MetricSpec",
    "MetricsServer",
    "ProcessMetrics",
    "check_health",
    "serve_metrics",
]
