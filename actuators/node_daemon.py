"""The node actuator: one per node, between the actuation topic and the workers on the node.

A ``CommandSource`` reads the commands keyed to this node, every partition by assignment
(no group membership, offsets still committed so a restarted daemon resumes); each goes
through the ``CommandPipeline``: the gate (signature, expiry, duplicates), then
``NodeDelivery`` (order, the worker's desired state, the channel). Workers apply commands
at a step boundary and answer over the Unix socket served here. Every outcome goes to the
results topic.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from dsec.actuators.channel import (
    Answer,
    ChannelError,
    Register,
    prepare_run_dir,
    read_frame,
    socket_path,
)
from dsec.actuators.command_source import CommandSource, dead_letters_to
from dsec.actuators.desired_state import WorkerKey
from dsec.actuators.gate import CommandGate, node_target
from dsec.actuators.node_delivery import DeliveryCounters, NodeDelivery, WorkerConnection
from dsec.actuators.pipeline import CommandPipeline
from dsec.actuators.results import Publish, ResultPublisher
from dsec.infra.consumer_loop import ConsumerLoopConfig, Start
from dsec.infra.observability.metrics import ProcessMetrics
from dsec.schemas import ActuationStatus, Verifier
from dsec.schemas.actuations import COMMAND_MAX_FUTURE_MS

log = logging.getLogger(__name__)

SEND_TIMEOUT_S = 5
SERVICE = "node-actuator"


@dataclass(frozen=True)
class NodeActuatorConfig:
    node_id: str
    run_dir: Path
    actuations_topic: str
    results_topic: str
    verifier: Verifier
    poll_interval_s: float = 0.2
    max_future_ms: int = COMMAND_MAX_FUTURE_MS  # how far ahead a command may be dated
    dead_letters_topic: str | None = None  # where a message that could not be handled goes


class NodeActuator:
    def __init__(
        self, config: NodeActuatorConfig, consumer_config: dict, publish: Publish,
        metrics: ProcessMetrics | None = None,
    ) -> None:
        self.config = config
        metrics = metrics or ProcessMetrics()
        self._consumer_config = {**consumer_config, "enable.auto.commit": False}
        metrics.add_health_check("node-actuator", self.health)
        self.socket_path = socket_path(config.run_dir, config.node_id)
        self._results = ResultPublisher(config.results_topic, publish, service=SERVICE,
                                        metrics=metrics)
        self._gate = CommandGate(None, config.verifier, addressed=node_target(config.node_id),
                                 max_future_ms=config.max_future_ms)
        self.delivery = NodeDelivery(config.run_dir / f"desired-{config.node_id}.json",
                                     self._results)
        self._pipeline = CommandPipeline(self._gate, self.delivery, self._results,
                                         report_duplicates=True)
        # Every partition, assigned rather than subscribed: the node reads the whole topic
        # anyway, and without group membership a broker too busy to answer heartbeats
        # cannot time the node out of its group and hold it in a rebalance (a member
        # rejoining waits up to max.poll.interval.ms). Committed offsets still resume a
        # restarted daemon.
        self._source = CommandSource(
            ConsumerLoopConfig((config.actuations_topic,),
                               str(self._consumer_config.get("group.id", SERVICE)),
                               poll_timeout_s=config.poll_interval_s, assign=True,
                               start=Start.COMMITTED, return_on_first=True),
            self._consumer_config, keys=lambda: (config.node_id,), take=self._pipeline.handle,
            undecodable=self._pipeline.undecodable,
            dead_letter=dead_letters_to(config.dead_letters_topic, publish, SERVICE),
            service=SERVICE, thread_name="dsec-node-consume", metrics=metrics)
        self._stop = threading.Event()
        self._accept_thread: threading.Thread | None = None
        self._server: socket.socket | None = None

    @property
    def counters(self) -> DeliveryCounters:
        return self.delivery.counters

    @property
    def results(self) -> dict[ActuationStatus, int]:
        return self._results.results

    # --- lifecycle ---------------------------------------------------------------

    def start(self, ready_timeout_s: float = 30.0) -> NodeActuator:
        prepare_run_dir(self.config.run_dir)
        self.delivery.load(self._gate, self.config.verifier)
        self.socket_path.unlink(missing_ok=True)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        previous_umask = os.umask(0o177)  # the socket is born owner-only
        try:
            server.bind(str(self.socket_path))
        finally:
            os.umask(previous_umask)
        server.listen(64)
        server.settimeout(0.5)
        self._server = server
        self._accept_thread = threading.Thread(target=self._accept_loop,
                                               name="dsec-node-accept", daemon=True)
        self._accept_thread.start()
        self._source.start()
        if not self._source.wait_ready(ready_timeout_s):
            log.warning("dsec node actuator: no partitions after %.0f s", ready_timeout_s)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._source.stop()
        if self._accept_thread is not None:
            self._accept_thread.join(timeout=10)
        self.delivery.close_all()
        if self._server is not None:
            self._server.close()
            self.socket_path.unlink(missing_ok=True)

    def health(self) -> str | None:
        """None while the consumer and the socket server are running, else what is not."""
        if self._accept_thread is None:
            return "the node actuator has not started"
        if not self._accept_thread.is_alive():
            return f"stopped: {self._accept_thread.name}"
        return self._source.down()

    def wait_ready(self, timeout_s: float) -> bool:
        return self._source.wait_ready(timeout_s)

    def connected_workers(self) -> list[WorkerKey]:
        return self.delivery.connected_workers()

    def receive(self, value: bytes | None) -> ActuationStatus | None:
        """Handles one message from the actuation topic (its key aside)."""
        return self._source.receive(value)

    # --- channel side ------------------------------------------------------------

    def _accept_loop(self) -> None:
        assert self._server is not None
        while not self._stop.is_set():
            try:
                sock, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                if not self._stop.is_set():
                    log.exception("dsec node actuator: accept failed")
                return
            sock.settimeout(None)
            if not _same_user(sock):
                log.warning("dsec node actuator: refused a connection from another user")
                sock.close()
                continue
            # a worker that stops reading must not hold the node (sends happen under a lock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                            struct.pack("ll", SEND_TIMEOUT_S, 0))
            thread = threading.Thread(target=self._serve, args=(sock,),
                                      name="dsec-node-worker", daemon=True)
            thread.start()

    def _serve(self, sock: socket.socket) -> None:
        connection: WorkerConnection | None = None
        key: WorkerKey | None = None
        try:
            hello = read_frame(sock)
            if not isinstance(hello, Register) or hello.identity.node_id != self.config.node_id:
                raise ChannelError("the first frame must register a worker of this node")
            connection = WorkerConnection(sock, hello.identity)
            key = (hello.identity.job_id, hello.identity.worker_id)
            self.delivery.register(key, connection)
            while not self._stop.is_set():
                frame = read_frame(sock)
                if isinstance(frame, Answer):
                    self.delivery.answered(key, connection.identity, frame)
        except (ChannelError, OSError) as exc:
            if not self._stop.is_set():
                log.info("dsec node actuator: worker channel closed: %s", exc)
        except Exception:
            log.exception("dsec node actuator: worker channel failed")
        finally:
            if connection is not None and key is not None:
                self.delivery.unregister(key, connection)
            sock.close()


def _same_user(sock: socket.socket) -> bool:
    """The peer runs as this user (Linux ``SO_PEERCRED``; elsewhere the 0600 socket and
    0700 run directory are the whole check)."""
    peercred = getattr(socket, "SO_PEERCRED", None)
    if peercred is None:
        return True
    credentials = sock.getsockopt(socket.SOL_SOCKET, peercred, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", credentials)
    return uid == os.getuid()
