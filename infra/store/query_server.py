"""Read-only SQL over loopback, so that ``dsec sql`` works while the stack holds the store.

Only the stack's process can open an embedded chDB directory; this server lets other
processes query through it. Loopback only, a bearer token from an owner-only file,
and every query runs with ClickHouse's ``readonly=1``.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
from datetime import date, datetime
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from clickhouse_connect.driver.client import Client

log = logging.getLogger(__name__)
MAX_QUERY_BYTES = 1 << 20


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def run_readonly(
    client: Client, lock: threading.Lock, sql: str, parameters: dict | None = None
) -> dict:
    with lock:
        result = client.query(sql, parameters=parameters or None, settings={"readonly": 1})
    return {
        "columns": list(result.column_names),
        "rows": [[_jsonable(v) for v in row] for row in result.result_rows],
    }


class QueryServer:
    def __init__(self, client: Client, lock: threading.Lock, port: int = 0) -> None:
        self.token = secrets.token_urlsafe(24)
        server_token = self.token

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: Any) -> None:
                return

            def _reply(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                if self.path != "/query":
                    self._reply(404, {"error": "not found"})
                    return
                supplied = self.headers.get("Authorization", "")
                if not secrets.compare_digest(supplied, f"Bearer {server_token}"):
                    self._reply(401, {"error": "bad or missing token"})
                    return
                length = int(self.headers.get("Content-Length") or 0)
                if not 0 < length <= MAX_QUERY_BYTES:
                    self._reply(400, {"error": f"query must be 1..{MAX_QUERY_BYTES} bytes"})
                    return
                try:
                    body = json.loads(self.rfile.read(length))
                    sql, parameters = body["sql"], body.get("parameters") or {}
                    if not isinstance(sql, str) or not isinstance(parameters, dict):
                        raise ValueError
                except (ValueError, KeyError, TypeError):
                    self._reply(400, {"error": 'body must be {"sql": str, "parameters": {}}'})
                    return
                try:
                    self._reply(200, run_readonly(client, lock, sql, parameters))
                except Exception as exc:
                    self._reply(400, {"error": str(exc)[:4000]})

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="dsec-query-server", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
