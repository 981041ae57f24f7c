"""The recommendation API (``dsec placement serve``'s app) on a loopback port, in a thread
of its own, and a client that asks it over HTTP, as any scheduler would: how the
experiments' restarters ask where a worker goes."""

from __future__ import annotations

import json
import socket
import threading
import urllib.request
from collections.abc import Callable

from dsec.placement.api import HistorySource, make_app
from dsec.placement.ranking import PlacementConfig
from dsec.schemas import now_ms

__all__ = ["RecommendationServer"]


class RecommendationServer:
    def __init__(self, source: HistorySource, config: PlacementConfig | None = None,
                 clock_ms: Callable[[], int] = now_ms) -> None:
        import uvicorn

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        app = make_app(source, config or PlacementConfig(), clock_ms=clock_ms)
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                     log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> RecommendationServer:
        self._thread.start()
        while not self._server.started:
            self._thread.join(0.05)
            if not self._thread.is_alive():
                raise RuntimeError("the recommendation API did not start")
        return self

    def recommend(self, request: dict, timeout_s: float = 30.0) -> dict:
        """``POST /v1/recommend``, as any client of the API asks it."""
        post = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/recommend", data=json.dumps(request).encode(),
            method="POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(post, timeout=timeout_s) as response:
            return json.loads(response.read())

    def __exit__(self, *_exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)
