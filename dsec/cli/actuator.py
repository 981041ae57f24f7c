"""``dsec actuator --node NODE_ID``: the node actuator daemon, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer


def actuator_command(
    node: Annotated[str, typer.Option(help="This node's id, as workers report it.")],
    bootstrap: Annotated[str | None, typer.Option(help="Kafka bootstrap servers.")] = None,
    run_dir: Annotated[
        Path | None, typer.Option(help="Owner-only folder for the worker socket.")
    ] = None,
) -> None:
    """Run the node actuator: commands for NODE from Kafka to its workers, results back."""
    from confluent_kafka import Producer

    from dsec.actuators import NodeActuator, NodeActuatorConfig
    from dsec.infra.kafka_clients import consumer_config, producer_config
    from dsec.infra.keys import verifier_for
    from dsec.infra.observability.metrics import ProcessMetrics
    from dsec.infra.observability.server import serve_metrics
    from dsec.infra.stop_signals import StopSignals
    from dsec.schemas import topic_names
    from dsec.schemas.settings import DsecSettings

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    overrides = {k: v for k, v in {"bootstrap": bootstrap, "run_dir": run_dir}.items() if v}
    settings = DsecSettings(**overrides)
    topics = topic_names(settings.topic_prefix)
    producer = Producer(producer_config(settings, client_id=f"dsec-node-{node}"))
    metrics = ProcessMetrics()
    server = serve_metrics(settings, metrics)

    def publish(topic: str, key: bytes, value: bytes) -> None:
        producer.produce(topic, key=key, value=value)
        producer.poll(0)

    daemon = NodeActuator(
        NodeActuatorConfig(
            node_id=node,
            run_dir=settings.run_directory(),
            actuations_topic=topics.actuations,
            results_topic=topics.actuation_results,
            verifier=verifier_for(settings),
            max_future_ms=settings.command_max_future_ms(),
            dead_letters_topic=topics.dead_letters,
        ),
        # One group per node and installation: two installations (topic prefixes) on one
        # Kafka never share a node's group.
        consumer_config(settings, group_id=f"{settings.topic_prefix}-node-{node}"),
        publish,
        metrics=metrics,
    )
    stop = StopSignals()
    daemon.start()
    logging.getLogger("dsec.actuator").info("node actuator %s listening on %s",
                                            node, daemon.socket_path)
    try:
        while not stop.wait(1.0):
            producer.poll(0)
    finally:
        daemon.stop()
        producer.flush(10)
        if server is not None:
            server.stop()
