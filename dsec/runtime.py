"""A worker's dsec runtime: the probe, and the actuator that applies commands inside it."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

from dsec.actuators import ApplyHooks, InProcessActuator
from dsec.ingest import KafkaTransport, Probe, ProbeConfig, ProbeCounters
from dsec.kafka_clients import consumer_config, producer_config
from dsec.schemas import ActionKind, WorkerIdentity, topic_names
from dsec.settings import DsecSettings


def default_worker_id() -> str:
    rank = os.environ.get("RANK")
    host = socket.gethostname()
    return f"{host}-rank{rank}" if rank is not None else f"{host}-{os.getpid()}"


class WorkerRuntime:
    def __init__(
        self,
        settings: DsecSettings,
        identity: WorkerIdentity,
        probe_config: ProbeConfig | None = None,
        actuate: bool = True,
    ) -> None:
        config = probe_config or ProbeConfig()
        topics = topic_names(settings.topic_prefix)
        transport = KafkaTransport(
            producer_config(
                settings,
                client_id=f"dsec-probe-{identity.worker_id}",
                **{
                    "message.timeout.ms": int(config.message_timeout_s * 1000),
                    "queue.buffering.max.messages": 10_000,
                },
            )
        )
        self.identity = identity
        self.probe = Probe(identity, topics.metrics, transport, config)
        self.hooks = ApplyHooks()
        self.actuator: InProcessActuator | None = None
        if actuate:
            self.actuator = InProcessActuator(
                identity=identity,
                consumer_config=consumer_config(
                    settings, group_id=f"dsec-worker-{identity.job_id}-{identity.worker_id}"
                ),
                actuations_topic=topics.actuations,
                results_topic=topics.actuation_results,
                hooks=self.hooks,
                signing_key=settings.signing_key_bytes(),
                publish=self.probe.publish,
            )
            self.probe.add_step_callback(self.actuator.apply_pending)

    def start(self) -> WorkerRuntime:
        self.probe.start()
        if self.actuator is not None:
            self.actuator.start()
        return self

    def on_action(self, kind: ActionKind | str, hook: Callable[[Any], str | None]) -> None:
        self.hooks.register(kind, hook)

    def shutdown(self) -> ProbeCounters:
        if self.actuator is not None:
            self.actuator.apply_pending()
            self.actuator.stop()
        return self.probe.shutdown()
