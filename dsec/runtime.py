"""A worker's dsec runtime: the probe, and the actuator that applies commands inside it."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from dsec.actuators import ApplyHooks, InProcessActuator
from dsec.actuators.channel import socket_path
from dsec.actuators.grad_accumulation import GradAccumulation
from dsec.actuators.precision import AutocastController, default_device_type
from dsec.actuators.snapshot_trigger import SnapshotTrigger
from dsec.actuators.snapshotter import SnapshotConfig, Snapshotter
from dsec.actuators.worker_channel import WorkerChannel
from dsec.actuators.worker_controls import WorkerControls
from dsec.infra.kafka_clients import consumer_config, producer_config
from dsec.infra.keys import verifier_for
from dsec.ingest import KafkaTransport, Probe, ProbeConfig, ProbeCounters, Transport
from dsec.ingest.cuda_memory import CudaMemoryCollector
from dsec.ingest.gateway_client import CommandPoller
from dsec.ingest.grad_sync import CommHook, GradSyncTimer, instrument_all_reduce, timed_comm_hook
from dsec.ingest.http_transport import HttpTransport, endpoint_transport
from dsec.ingest.nvml import NvmlSampler
from dsec.schemas import (
    ActionKind,
    ActuationResult,
    ActuationStatus,
    WorkerIdentity,
    encode,
    topic_names,
)
from dsec.schemas.settings import DsecSettings
from dsec.schemas.units import s_to_ms

log = logging.getLogger(__name__)

# The step callbacks run when woken: at least once a flush interval (10 a second).
MEMORY_CHECK_EVERY_RUNS = 10
MEMORY_WARNING_INTERVAL_S = 60.0


def _instrument_all_reduce_if_present(timer: GradSyncTimer) -> Callable[[], None] | None:
    import torch.distributed

    if not torch.distributed.is_available():
        return None
    return instrument_all_reduce(timer)


def default_worker_id() -> str:
    rank = os.environ.get("RANK")
    host = socket.gethostname()
    return f"{host}-rank{rank}" if rank is not None else f"{host}-{os.getpid()}"


def probe_transport(settings: DsecSettings, identity: WorkerIdentity, config: ProbeConfig,
                    metrics_topic: str, kafka_logger: logging.Logger | None = None,
                    results_topic: str | None = None) -> Transport:
    """Kafka, or in endpoint mode (``settings.endpoint``) the ingest gateway over HTTP;
    ``kafka_logger``: where the Kafka client's own log goes (default: stderr);
    ``results_topic``: in endpoint mode, the worker fetches its commands from the gateway
    and posts their results there."""
    if settings.endpoint:
        if settings.endpoint_token is None:
            raise ValueError("endpoint mode needs a token: endpoint_token= or "
                             "DSEC_ENDPOINT_TOKEN (the gateway's enrolment token, or this "
                             "worker's runtime token)")
        return endpoint_transport(settings.endpoint,
                                  settings.endpoint_token.get_secret_value(), identity,
                                  metrics_topic, config, results_topic)
    return KafkaTransport(
        producer_config(
            settings,
            client_id=f"dsec-probe-{identity.worker_id}",
            **{
                "message.timeout.ms": s_to_ms(config.message_timeout_s),
                "queue.buffering.max.messages": config.transport_queue_max_messages,
            },
            **({} if kafka_logger is None else {"logger": kafka_logger}),
        )
    )


def _listening(path: os.PathLike[str]) -> bool:
    """Whether a node actuator answers on ``path`` (a socket file left by a crashed
    daemon does not count)."""
    if not os.path.exists(path):
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(0.5)
    try:
        probe.connect(os.fspath(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


class WorkerRuntime:
    def __init__(
        self,
        settings: DsecSettings,
        identity: WorkerIdentity,
        probe_config: ProbeConfig | None = None,
        actuate: bool = True,
        transport: Transport | None = None,
        kafka_logger: logging.Logger | None = None,
        actuator_stop_timeout_s: float = 10.0,
    ) -> None:
        """``kafka_logger``: where the Kafka clients' own log goes (default: stderr);
        ``actuator_stop_timeout_s``: how long ``shutdown`` waits for the actuator's consumer."""
        config = probe_config or ProbeConfig()
        topics = topic_names(settings.topic_prefix)
        node_socket = socket_path(settings.run_directory(), identity.node_id)
        use_node = settings.actuator_channel == "node" or (
            settings.actuator_channel == "auto" and _listening(node_socket)
        )
        # in endpoint mode without a node actuator, commands come through the gateway
        polls = bool(actuate and not use_node and settings.endpoint)
        transport = transport or probe_transport(
            settings, identity, config, topics.metrics, kafka_logger,
            results_topic=topics.actuation_results if polls else None)
        self.identity = identity
        self.settings = settings
        self._actuator_stop_timeout_s = actuator_stop_timeout_s
        self._results_topic = topics.actuation_results
        self.probe = Probe(identity, topics.metrics, transport, config)
        self.grad_sync = GradSyncTimer(self.probe)
        self.probe.add_collector(self.grad_sync.collect)
        self._undo_all_reduce: Callable[[], None] | None = None
        if config.grad_sync_timing:
            self._undo_all_reduce = _instrument_all_reduce_if_present(self.grad_sync)
        cuda_memory: CudaMemoryCollector | None = None
        if config.cuda_memory_interval_s > 0:
            cuda_memory = CudaMemoryCollector(self.probe, config.cuda_memory_interval_s)
            self.probe.add_collector(cuda_memory)
            self.probe.add_step_callback(cuda_memory.bind_device)
        self.nvml: NvmlSampler | None = None
        if config.gpu_sample_interval_s > 0:
            self.nvml = NvmlSampler(
                self.probe, config.gpu_sample_interval_s, gpu_indices=config.gpu_indices,
                current_device=(lambda: cuda_memory.device_index) if cuda_memory else None,
            )
        self.hooks = ApplyHooks()
        self.controls = WorkerControls(
            precision=AutocastController(default_device_type()),
            snapshot=SnapshotTrigger(lambda: self.probe.global_step),
            grad_accumulation=GradAccumulation(on_window=self.probe.observe_micro_steps),
        )
        self.controls.register(self.hooks)
        self.actuator: InProcessActuator | None = None
        self.channel: WorkerChannel | None = None
        self._memory_checks = 0
        self._memory_warned_s = float("-inf")
        self.probe.add_step_callback(self._check_memory_budget)
        if actuate and use_node:
            self.channel = WorkerChannel(identity, node_socket, self.hooks,
                                         on_command=self.probe.wake)
            self.probe.add_step_callback(self.channel.apply_pending)
        elif polls and not isinstance(transport, HttpTransport):
            log.info("dsec: endpoint mode: no commands reach worker %s through a transport "
                     "of its own", identity.worker_id)
        elif actuate:
            poll = (CommandPoller(transport.client.sibling(config.endpoint_request_timeout_s))
                    if polls and isinstance(transport, HttpTransport) else None)
            self.actuator = InProcessActuator(
                identity=identity,
                consumer_config={} if poll is not None else consumer_config(
                    settings, group_id=f"dsec-worker-{identity.job_id}-{identity.worker_id}",
                    **({} if kafka_logger is None else {"logger": kafka_logger}),
                ),
                actuations_topic=topics.actuations,
                results_topic=topics.actuation_results,
                hooks=self.hooks,
                verifier=verifier_for(settings),
                publish=self.probe.publish,
                on_command=self.probe.wake,
                max_future_ms=settings.command_max_future_ms(),
                dead_letters_topic=topics.dead_letters,
                poll=poll,
            )
            self.probe.add_step_callback(self.actuator.apply_pending)

    def start(self, commands_ready_timeout_s: float = 30.0) -> WorkerRuntime:
        """``commands_ready_timeout_s``: how long the in-process actuator may hold the
        caller while its consumer is assigned (0: not at all; a command sent before the
        assignment is then missed)."""
        self.probe.start()
        if self.nvml is not None:
            self.nvml.start()
        if self.actuator is not None:
            self.actuator.start(commands_ready_timeout_s)
        if self.channel is not None:
            self.channel.start()
        return self

    def _check_memory_budget(self) -> None:
        """The CPU soft budget is enforced by reporting: a violation is counted, logged and
        published as a failed result of the cap in force, at most once a minute."""
        self._memory_checks += 1
        if self._memory_checks % MEMORY_CHECK_EVERY_RUNS:
            return
        cap = self.controls.memory_cap
        over_bytes = cap.check()
        now_s = time.monotonic()
        if not over_bytes or now_s - self._memory_warned_s < MEMORY_WARNING_INTERVAL_S:
            return
        if ActionKind.MEMORY_CAP in self.hooks.pending():
            return  # this check puts the budget in force: the next one reports against it
        self._memory_warned_s = now_s
        detail = (f"soft memory budget exceeded: {over_bytes} bytes over {cap.limit_bytes} "
                  f"({cap.violations} violations)")
        log.warning("dsec: worker %s %s", self.identity.worker_id, detail)
        actuation_id = self.hooks.in_force.get(ActionKind.MEMORY_CAP)
        if actuation_id is not None:  # on the audit trail of the cap that is not holding
            result = ActuationResult(
                actuation_id=actuation_id, identity=self.identity,
                action_kind=ActionKind.MEMORY_CAP.value, status=ActuationStatus.FAILED,
                detail=detail,
            )
            self.probe.publish(self._results_topic, self.identity.node_id.encode(),
                               encode(result))

    def enable_snapshots(
        self,
        model: Any,
        optimizer: Any = None,
        *,
        directory: str | None = None,
        quantise_weights: bool = False,
        quantise_optimizer: bool = False,
        extra_state: Callable[[], dict[str, Any]] | None = None,
    ) -> Snapshotter:
        snapshotter = Snapshotter(model, optimizer, SnapshotConfig(
            directory=directory or self.settings.snapshot_location(),
            quantise_weights=quantise_weights,
            quantise_optimizer=quantise_optimizer,
        ))
        self.controls.snapshot.attach(snapshotter, extra_state)
        return snapshotter

    def report_resume(self, source: str, recovery_time_s: float, step: int | None = None) -> None:
        """The worker resumed after an interruption, from ``source`` (``snapshot``,
        ``checkpoint`` or ``scratch``), which took ``recovery_time_s``: a recovery sample,
        from which the fleet's snapshot recovery time is computed."""
        self.probe.record_fields("recovery", {
            "recovery_time_s": min(max(float(recovery_time_s), 0.0), 86400.0),
            "source": source,
            "step": self.probe.global_step if step is None else max(int(step), 0),
        })

    def on_action(self, kind: ActionKind | str, hook: Callable[[Any], str | None]) -> None:
        self.hooks.register(kind, hook)

    def apply_pending(self) -> int:
        """Applies the commands that arrived since the last step boundary, now; returns how
        many. Steps and episode ends do this on their own; a loop calls it at a safe point
        of its own (the start of an update, after a long rollout) so that a command does
        not wait for the next optimizer step."""
        if self.channel is not None:
            return self.channel.apply_pending()
        if self.actuator is not None:
            return self.actuator.apply_pending()
        return 0

    def watch_ddp(self, ddp_model: Any, state: Any = None, inner: CommHook | None = None) -> None:
        """Times every gradient bucket DDP all-reduces, through the controls' hook (gradient
        compression, weighted by the sync priority) or ``inner``, a hook of your own (the
        actuator's compression and sync priority then have nothing to act through)."""
        hook = inner if inner is not None else self.controls.comm_hook()
        ddp_model.register_comm_hook(state, timed_comm_hook(self.grad_sync, hook))

    def shutdown(self) -> ProbeCounters:
        if self._undo_all_reduce is not None:
            self._undo_all_reduce()
            self._undo_all_reduce = None
        if self.nvml is not None:
            self.nvml.stop()
        self.apply_pending()
        if self.actuator is not None:
            self.actuator.stop(self._actuator_stop_timeout_s)
        if self.channel is not None:
            self.channel.stop()
        snapshotter = self.controls.snapshot.snapshotter
        if snapshotter is not None:
            snapshotter.close()
        return self.probe.shutdown()
