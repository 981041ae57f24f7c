"""A runtime's webhook on loopback for the tests: a real HTTP server that records what is
posted to it, when, and answers as a runtime would."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

from dsec.schemas import now_ms


class RecordingWebhook:
    def __init__(self, answer: bytes = b'{"status": "applied"}') -> None:
        self.received: list[tuple[int, bytes]] = []  # (epoch ms, body)
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                received.append((now_ms(), self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *_args: object) -> None:
                pass

        self._server = HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_port}/dsec"

    @property
    def bodies(self) -> list[bytes]:
        return [body for _at_ms, body in self.received]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
