"""The ingest gateway's real HTTP server in a thread, for tests of its clients (the probes
in endpoint mode) and of the server itself; what it would publish to Kafka is recorded
(or, with a publisher of the test's own, sent on)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

import uvicorn

from dsec.infra.kafka_local import free_port
from dsec.infra.runtime_registry import RuntimeRegistry
from dsec.ingest.gateway import IngestGateway
from dsec.ingest.gateway_config import GatewayConfig
from dsec.ingest.gateway_publisher import BatchPublisher, PublishError
from dsec.schemas import MetricBatch, decode
from dsec.services.gateway_http import uvicorn_config


class RecordingPublisher:
    """Keeps every batch the gateway would publish; ``failing`` refuses them (a broker away)."""

    def __init__(self) -> None:
        self.published: list[tuple[bytes, bytes]] = []
        self.failing = False

    async def publish(self, key: bytes, value: bytes) -> None:
        if self.failing:
            raise PublishError("broker away")
        self.published.append((key, value))

    def batches(self) -> list[MetricBatch]:
        return [decode(value, MetricBatch) for _key, value in self.published]


@dataclass
class ServedGateway:
    gateway: IngestGateway
    url: str
    port: int


@contextmanager
def serve(gateway: IngestGateway, config: GatewayConfig) -> Iterator[ServedGateway]:
    """``gateway`` on ``config.port`` when the test chose one, else on a free port (tests
    run side by side here), until the block ends."""
    if "port" not in config.model_fields_set or config.port == 0:
        config = config.model_copy(update={"port": free_port()})
    server = uvicorn.Server(uvicorn_config(gateway.app(), config))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(200):
            if server.started:
                break
            time.sleep(0.05)
        assert server.started, "the gateway did not start"
        yield ServedGateway(gateway, f"http://127.0.0.1:{config.port}", config.port)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def serving(config: GatewayConfig, publisher: BatchPublisher | None = None,
            job_id: str = "job-a") -> AbstractContextManager[ServedGateway]:
    """A gateway of its own (runtimes in memory) served until the block ends."""
    gateway = IngestGateway(config, RuntimeRegistry(), publisher or RecordingPublisher(), job_id)
    return serve(gateway, config)
