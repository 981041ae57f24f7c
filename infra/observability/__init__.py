"""Observability of dsec's own services: Prometheus metrics and health, served by each
process on ``/metrics`` and ``/healthz``."""

from dsec.infra.observability.metrics import (
    CATALOGUE,
    METRIC_NAMES,
    SERVICE_METRICS,
    MetricSpec,
    ProcessMetrics,
)
from dsec.infra.observability.server import MetricsServer, check_health, serve_metrics

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
