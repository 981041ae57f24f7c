"""A worker's dsec runtime: the probe, and the actuator that applies commands inside it."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

from dsec.actuators import ApplyHooks, InProcessActuator
from dsec.ingest import KafkaTransport, Probe, ProbeConfig, ProbeCounters, Transport
from dsec.ingest.cuda_memory import CudaMemoryCollector
from dsec.ingest.grad_sync import CommHook, GradSyncTimer, instrument_all_reduce, timed_comm_hook
from dsec.ingest.nvml import NvmlSampler
from dsec.kafka_clients import consumer_config, producer_config
from dsec.schemas import ActionKind, WorkerIdentity, topic_names
from dsec.settings import DsecSettings


def _instrument_all_reduce_if_present(timer: GradSyncTimer) -> Callable[[], None] | None:
    import torch.distributed

    if not torch.distributed.is_available():
        return None
    return instrument_all_reduce(timer)


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
        transport: Transport | None = None,
    ) -> None:
        config = probe_config or ProbeConfig()
        topics = topic_names(settings.topic_prefix)
        transport = transport or KafkaTransport(
            producer_config(
                settings,
                client_id=f"dsec-probe-{identity.worker_id}",
                **{
                    "message.timeout.ms": int(config.message_timeout_s * 1000),
                    "queue.buffering.max.messages": config.transport_queue_max_messages,
                },
            )
        )
        self.identity = identity
        self.probe = Probe(identity, topics.metrics, transport, config)
        self.grad_sync = GradSyncTimer(self.probe)
        self.probe.add_collector(self.grad_sync.collect)
        self._undo_all_reduce: Callable[[], None] | None = None
        if config.grad_sync_timing:
            self._undo_all_reduce = _instrument_all_reduce_if_present(self.grad_sync)
        if config.cuda_memory_interval_s > 0:
            cuda_memory = CudaMemoryCollector(self.probe, config.cuda_memory_interval_s)
            self.probe.add_collector(cuda_memory)
            self.probe.add_step_callback(cuda_memory.bind_device)
        self.nvml: NvmlSampler | None = None
        if config.gpu_sample_interval_s > 0:
            self.nvml = NvmlSampler(
                self.probe, config.gpu_sample_interval_s, gpu_indices=config.gpu_indices
            )
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
        if self.nvml is not None:
            self.nvml.start()
        if self.actuator is not None:
            self.actuator.start()
        return self

    def on_action(self, kind: ActionKind | str, hook: Callable[[Any], str | None]) -> None:
        self.hooks.register(kind, hook)

    def watch_ddp(self, ddp_model: Any, state: Any = None, inner: CommHook | None = None) -> None:
        """Times every gradient bucket DDP all-reduces (``inner``: a hook of your own)."""
        ddp_model.register_comm_hook(state, timed_comm_hook(self.grad_sync, inner))

    def shutdown(self) -> ProbeCounters:
        if self._undo_all_reduce is not None:
            self._undo_all_reduce()
            self._undo_all_reduce = None
        if self.nvml is not None:
            self.nvml.stop()
        if self.actuator is not None:
            self.actuator.apply_pending()
            self.actuator.stop()
        return self.probe.shutdown()
