"""The gateway's HTTP server: uvicorn with its timeouts, connection cap and optional TLS.

uvicorn times out idle keep-alive connections only after a response, so a client that
connects and sends its headers a byte at a time (or nothing) would hold its connection for
ever; ``header_deadline_protocol`` closes a connection whose next request's headers have
not arrived within the deadline.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol

from dsec.ingest.gateway_config import GatewayConfig


def header_deadline_protocol(header_timeout_s: float) -> type[H11Protocol]:
    class HeaderDeadlineProtocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _cycle_when_armed: object = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._cycle_when_armed = self.cycle
            self._deadline = self.loop.call_later(header_timeout_s, self._expire)

        def _expire(self) -> None:
            in_progress = self.cycle is not None and not self.cycle.response_complete
            idle = not in_progress and self.cycle is self._cycle_when_armed
            if idle and not self.transport.is_closing():
                self.transport.close()

    return HeaderDeadlineProtocol


def uvicorn_options(config: GatewayConfig) -> dict[str, Any]:
    """The keyword arguments of ``uvicorn.Config`` for ``config``."""
    options: dict[str, Any] = {
        "host": config.host, "port": config.port, "log_level": "warning",
        "http": header_deadline_protocol(config.header_timeout_s),
        "timeout_keep_alive": config.keep_alive_timeout_s,
        "limit_concurrency": config.max_connections,
        "h11_max_incomplete_event_size": 64 * 1024,  # headers larger than this: 400
    }
    if config.tls_certfile is not None:
        options["ssl_certfile"] = str(config.tls_certfile)
        options["ssl_keyfile"] = str(config.tls_keyfile)
    return options


def uvicorn_config(app: Any, config: GatewayConfig) -> Config:
    return Config(app, **uvicorn_options(config))
