"""The ingest gateway assembled on real Kafka: HTTP app, batch publisher, webhook forwarder."""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import Producer

from dsec.actuators.webhooks import WebhookForwarder
from dsec.infra.kafka_clients import consumer_config, producer_config
from dsec.infra.keys import verifier_for
from dsec.infra.observability.metrics import ProcessMetrics
from dsec.infra.observability.server import serve_metrics
from dsec.infra.runtime_registry import RuntimeRegistry
from dsec.infra.topics import ensure_topics
from dsec.ingest.gateway import IngestGateway
from dsec.ingest.gateway_config import GatewayConfig
from dsec.ingest.gateway_publisher import KafkaBatchPublisher
from dsec.schemas import topic_names
from dsec.schemas.settings import DsecSettings


@dataclass
class GatewayService:
    gateway: IngestGateway
    registry: RuntimeRegistry
    publisher: KafkaBatchPublisher
    forwarder: WebhookForwarder | None
    _results_producer: Producer | None

    def start(self) -> GatewayService:
        if self.forwarder is not None:
            self.forwarder.start()
        return self

    def close(self) -> None:
        self.registry.flush()
        if self.forwarder is not None:
            self.forwarder.stop()
        if self._results_producer is not None:
            self._results_producer.flush(10)
        self.publisher.close()


def build_gateway(
    settings: DsecSettings, config: GatewayConfig, webhooks: bool = True
) -> GatewayService:
    ensure_topics(settings)
    topics = topic_names(settings.topic_prefix)
    metrics = ProcessMetrics()
    registry = RuntimeRegistry(settings.data_dir / "gateway" / "runtimes.json")
    publisher = KafkaBatchPublisher(
        producer_config(settings, client_id="dsec-ingest-gateway"), topics.metrics,
        config.publish_timeout_s, metrics=metrics,
    )
    gateway = IngestGateway(config, registry, publisher, settings.job_id, metrics=metrics)
    forwarder = None
    results_producer = None
    if webhooks:
        results_producer = Producer(producer_config(settings, client_id="dsec-gateway-results"))

        def publish(topic: str, key: bytes, value: bytes) -> None:
            results_producer.produce(topic, value=value, key=key)
            results_producer.poll(0)

        forwarder = WebhookForwarder(
            registry, settings.job_id,
            # a first start forwards what comes from now on, not the topic's history
            consumer_config(settings, group_id=f"dsec-gateway-webhooks-{settings.job_id}",
                            **{"auto.offset.reset": "latest"}),
            topics.actuations, topics.actuation_results, verifier_for(settings),
            publish, config.webhook_timeout_s, metrics=metrics,
            max_future_ms=settings.command_max_future_ms(),
            dead_letters_topic=topics.dead_letters,
        )
    return GatewayService(gateway, registry, publisher, forwarder, results_producer)


def run_gateway(settings: DsecSettings, config: GatewayConfig) -> None:
    """Serves until interrupted."""
    import uvicorn

    from dsec.services.gateway_http import uvicorn_config

    service = build_gateway(settings, config).start()
    # The same /metrics and /healthz as on the gateway's own port, on the metrics port
    # every dsec service answers on.
    metrics_server = serve_metrics(settings, service.gateway.metrics)
    try:
        uvicorn.Server(uvicorn_config(service.gateway.app(), config)).run()
    finally:
        service.close()
        if metrics_server is not None:
            metrics_server.stop()
