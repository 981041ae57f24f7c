"""``/metrics`` and ``/healthz`` over HTTP, on a thread of the service's process.

A port that cannot be bound is logged and the service runs on without its endpoint:
telemetry never stops the service it observes.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST

from dsec.infra.observability.metrics import ProcessMetrics
from dsec.schemas.settings import DsecSettings

log = logging.getLogger(__name__)


class MetricsServer:
    def __init__(self, metrics: ProcessMetrics, host: str = "127.0.0.1", port: int = 0) -> None:
        """``port`` 0 binds any free port (read it back from ``port``)."""
        self.metrics = metrics
        self._address = (host, port)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        host = self._address[0]
        if host in ("", "0.0.0.0", "::"):
            host = "127.0.0.1"
        return f"http://{host}:{self.port}"

    def start(self) -> MetricsServer:
        metrics = self.metrics

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._answer(200, metrics.exposition(), CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    healthy, checks = metrics.health()
                    body = {"status": "ok" if healthy else "unhealthy", "checks": checks}
                    self._answer(200 if healthy else 503, json.dumps(body).encode(),
                                 "application/json")
                else:
                    self._answer(404, b"not found\n", "text/plain")

            def _answer(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return  # scraped every few seconds: not worth a log line each

        self._server = ThreadingHTTPServer(self._address, Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="dsec-metrics-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


def serve_metrics(
    settings: DsecSettings, metrics: ProcessMetrics, port_offset: int = 0
) -> MetricsServer | None:
    """The endpoint on ``metrics_host:metrics_port + port_offset``; None when the setting
    is 0 (off) or the port cannot be bound."""
    if settings.metrics_port == 0:
        return None
    port = settings.metrics_port + port_offset
    try:
        return MetricsServer(metrics, settings.metrics_host, port).start()
    except OSError as exc:
        log.error("metrics endpoint not served on %s:%d: %s", settings.metrics_host, port, exc)
        return None


def check_health(url: str, timeout_s: float = 5.0) -> tuple[bool, str]:
    """GET a ``/healthz`` URL: (healthy, what it answered or why it could not be asked)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status == 200, response.read(65536).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return False, exc.read(65536).decode("utf-8", "replace") or f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return False, f"{url}: {reason}"
