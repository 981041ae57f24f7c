"""The node actuator: one per node, between the actuation topic and the workers on the node.

A consumer thread reads the commands keyed to this node, checks them (signature,
expiry, duplicates, order) and records them as the desired state of their
worker; commands are delivered over the local channel to the worker, which
applies them at a step boundary and answers. Every outcome goes to the results
topic. A worker that registers again gets its desired state re-sent. The desired
state is kept in the run directory too, so a restarted daemon still has it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from pydantic import ValidationError

from dsec.actuators.channel import (
    Answer,
    Apply,
    ChannelError,
    Register,
    encode_frame,
    prepare_run_dir,
    read_frame,
    socket_path,
)
from dsec.actuators.desired_state import (
    DesiredStateBook,
    OutOfOrder,
    WorkerKey,
    worker_key,
)
from dsec.actuators.gate import CommandGate, node_target, out_of_bounds_result
from dsec.actuators.snapshot_store import write_atomically
from dsec.infra.observability.kafka import ConsumerLag
from dsec.infra.observability.metrics import (
    ACTUATIONS,
    EVENTS_IN,
    EVENTS_OUT,
    ProcessMetrics,
    action_label,
)
from dsec.schemas import (
    ActuationCommand,
    ActuationResult,
    ActuationStatus,
    DecodeError,
    SignatureError,
    WorkerIdentity,
    decode,
    encode,
    now_ms,
    verify,
)
from dsec.schemas.actuations import COMMAND_MAX_FUTURE_MS

log = logging.getLogger(__name__)

Publish = Callable[[str, bytes, bytes], None]  # (topic, key, value)

SEND_TIMEOUT_S = 5
SENT_REMEMBERED = 10_000  # commands sent to workers and not yet answered
SERVICE = "node-actuator"


@dataclass(frozen=True)
class NodeActuatorConfig:
    node_id: str
    run_dir: Path
    actuations_topic: str
    results_topic: str
    signing_key: bytes
    poll_interval_s: float = 0.2
    max_future_ms: int = COMMAND_MAX_FUTURE_MS  # how far ahead a command may be dated


@dataclass
class NodeCounters:
    received: int = 0
    delivered: int = 0
    undecodable: int = 0
    registrations: int = 0
    replayed: int = 0


class _Connection:
    def __init__(self, sock: socket.socket, identity: WorkerIdentity) -> None:
        self.sock = sock
        self.identity = identity
        self._lock = threading.Lock()

    def send(self, frame: Apply) -> bool:
        try:
            with self._lock:
                self.sock.sendall(encode_frame(frame))
        except OSError:
            return False
        return True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class NodeActuator:
    def __init__(
        self, config: NodeActuatorConfig, consumer_config: dict, publish: Publish,
        metrics: ProcessMetrics | None = None,
    ) -> None:
        self.config = config
        metrics = metrics or ProcessMetrics()
        self._lag = ConsumerLag(metrics, SERVICE)
        self._consumer_config = {**consumer_config, "enable.auto.commit": False,
                                 **self._lag.client_config()}
        self._commands_in = metrics.counter(EVENTS_IN).labels(SERVICE, config.actuations_topic)
        self._results_out = metrics.counter(EVENTS_OUT).labels(SERVICE, config.results_topic)
        self._actuations = metrics.counter(ACTUATIONS)
        metrics.add_health_check("node-actuator", self.health)
        self._publish = publish
        self._gate = CommandGate(None, config.signing_key, addressed=node_target(config.node_id),
                                 max_future_ms=config.max_future_ms)
        self._book = DesiredStateBook()
        self._connections: dict[WorkerKey, _Connection] = {}
        # What was sent, by actuation id, until answered: a one-shot command can be replaced
        # in the book by a newer one before the worker answers it.
        self._sent: OrderedDict[str, ActuationCommand] = OrderedDict()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._threads: list[threading.Thread] = []
        self._server: socket.socket | None = None
        self.socket_path = socket_path(config.run_dir, config.node_id)
        self._state_path = config.run_dir / f"desired-{config.node_id}.json"
        self.counters = NodeCounters()
        self.results: dict[ActuationStatus, int] = dict.fromkeys(ActuationStatus, 0)

    # --- lifecycle ---------------------------------------------------------------

    def start(self, ready_timeout_s: float = 30.0) -> NodeActuator:
        prepare_run_dir(self.config.run_dir)
        self._load_desired_state()
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
        for target, name in ((self._accept_loop, "accept"), (self._consume_loop, "consume")):
            thread = threading.Thread(target=target, name=f"dsec-node-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        if not self._ready.wait(ready_timeout_s):
            log.warning("dsec node actuator: no partitions after %.0f s", ready_timeout_s)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        with self._lock:
            for connection in self._connections.values():
                connection.close()
            self._connections.clear()
        if self._server is not None:
            self._server.close()
            self.socket_path.unlink(missing_ok=True)

    def health(self) -> str | None:
        """None while the consumer and the socket server are running, else what is not."""
        if not self._threads:
            return "the node actuator has not started"
        stopped = [t.name for t in self._threads if not t.is_alive()]
        if stopped:
            return f"stopped: {', '.join(stopped)}"
        return None

    def wait_ready(self, timeout_s: float) -> bool:
        return self._ready.wait(timeout_s)

    def connected_workers(self) -> list[WorkerKey]:
        with self._lock:
            return list(self._connections)

    # --- Kafka side --------------------------------------------------------------

    def _consume_loop(self) -> None:
        consumer = Consumer(self._consumer_config)
        try:
            # Every partition, assigned rather than subscribed: the node reads the whole
            # topic anyway, and without group membership a broker too busy to answer
            # heartbeats cannot time the node out of its group and hold it in a rebalance
            # (a member rejoining waits up to max.poll.interval.ms). Committed offsets
            # still resume a restarted daemon.
            partitions = self._partitions(consumer)
            if partitions is None:
                return
            consumer.assign(partitions)
            self._ready.set()
            while not self._stop.is_set():
                message = consumer.poll(self.config.poll_interval_s)
                if message is None:
                    continue
                if message.error():
                    if message.error().code() != KafkaError._PARTITION_EOF:
                        log.warning("dsec node actuator: %s", message.error())
                    continue
                self._commands_in.inc()
                try:
                    self.receive(message.value())
                except Exception:  # one bad command must not stop the node
                    log.exception("dsec node actuator: command not handled")
                consumer.commit(message=message, asynchronous=True)
        except Exception:
            log.exception("dsec node actuator: consumer stopped")
        finally:
            self._ready.set()
            consumer.close()

    def _partitions(self, consumer: Consumer) -> list[TopicPartition] | None:
        """The actuation topic's partitions (at their committed offsets); asked again
        until the topic exists, None when stopped first."""
        topic = self.config.actuations_topic
        while not self._stop.is_set():
            try:
                metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
            except KafkaException as exc:
                log.warning("dsec node actuator: no metadata for %s: %s", topic, exc)
                metadata = None
            if metadata is not None and metadata.error is None and metadata.partitions:
                return [TopicPartition(topic, partition) for partition in metadata.partitions]
            self._stop.wait(1.0)
        return None

    def receive(self, value: bytes | None) -> None:
        """Handles one message from the actuation topic."""
        try:
            command = decode(value, ActuationCommand)
        except DecodeError as exc:
            self._reject_undecodable(value, exc.reason)
            return
        if command.target.node_id != self.config.node_id:
            return
        self.counters.received += 1
        with self._lock:
            rejection = self._gate.check(command, now_ms())
            if rejection is not None:
                if not self._gate.reportable(command, rejection):
                    return
                detail = rejection.detail
                status = rejection.status
                if rejection.duplicate:
                    status = ActuationStatus.REJECTED
                    detail = "duplicate actuation id: not applied again"
                self._report(command, command.target, status, detail)
                return
            verdict = self._book.accept(command)
            if isinstance(verdict, OutOfOrder):
                self._report(command, command.target, ActuationStatus.STALE,
                             f"out of order: a newer {command.action.kind.value} command "
                             f"(t={verdict.newer_time_ms}) is already in force")
                return
            if verdict.superseded is not None:
                self._report(verdict.superseded, verdict.superseded.target,
                             ActuationStatus.SUPERSEDED,
                             f"superseded by {command.actuation_id} before delivery")
            self._save_desired_state()
            self._deliver(worker_key(command))

    def _reject_undecodable(self, value: bytes | None, reason: str) -> None:
        """An out-of-bounds or malformed command is reported when it names this node."""
        self.counters.undecodable += 1
        result = out_of_bounds_result(value, reason)
        if result is None:
            log.warning("dsec node actuator: undecodable command: %s", reason)
            return
        if result.identity.node_id == self.config.node_id:
            self._send_result(result)

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
        connection: _Connection | None = None
        try:
            hello = read_frame(sock)
            if not isinstance(hello, Register) or hello.identity.node_id != self.config.node_id:
                raise ChannelError("the first frame must register a worker of this node")
            connection = _Connection(sock, hello.identity)
            key = (hello.identity.job_id, hello.identity.worker_id)
            self._register(key, connection)
            while not self._stop.is_set():
                frame = read_frame(sock)
                if isinstance(frame, Answer):
                    self._answered(key, connection.identity, frame)
        except (ChannelError, OSError) as exc:
            if not self._stop.is_set():
                log.info("dsec node actuator: worker channel closed: %s", exc)
        except Exception:
            log.exception("dsec node actuator: worker channel failed")
        finally:
            if connection is not None:
                with self._lock:
                    key = (connection.identity.job_id, connection.identity.worker_id)
                    if self._connections.get(key) is connection:
                        del self._connections[key]
            sock.close()

    def _register(self, key: WorkerKey, connection: _Connection) -> None:
        with self._lock:
            old = self._connections.get(key)
            self._connections[key] = connection
            self.counters.registrations += 1
            for command in self._book.desired(key):
                if connection.send(_apply_frame(command, replay=True)):
                    self.counters.replayed += 1
                    self._remember_sent(command)
            self._deliver(key)
        if old is not None and old is not connection:
            old.close()

    def _deliver(self, key: WorkerKey) -> None:
        connection = self._connections.get(key)
        if connection is None:
            return  # kept as desired state until the worker registers
        for command in self._book.undelivered(key):
            if not connection.send(_apply_frame(command, replay=False)):
                return
            self._book.mark_delivered(key, command.actuation_id)
            self._remember_sent(command)
            self.counters.delivered += 1

    def _remember_sent(self, command: ActuationCommand) -> None:
        self._sent[command.actuation_id] = command
        self._sent.move_to_end(command.actuation_id)
        if len(self._sent) > SENT_REMEMBERED:
            self._sent.popitem(last=False)

    def _answered(self, key: WorkerKey, identity: WorkerIdentity, answer: Answer) -> None:
        with self._lock:
            command = self._sent.pop(answer.actuation_id, None) or next(
                (c for c in self._book.commands() if c.actuation_id == answer.actuation_id),
                None)
            if answer.status is ActuationStatus.APPLIED:
                self._book.mark_applied(key, answer.actuation_id)
            self._book.forget_answered(key, answer.actuation_id)
            self._save_desired_state()
        detail = f"re-applied on registration: {answer.detail}" if answer.replay else answer.detail
        result = ActuationResult(
            actuation_id=answer.actuation_id, identity=identity,
            action_kind=command.action.kind.value if command else "",
            status=answer.status, detail=detail[:2048],
            command_time_ms=command.event_time_ms if command else None,
        )
        self._send_result(result)

    # --- results and persistence -------------------------------------------------

    def _report(self, command: ActuationCommand, identity: WorkerIdentity,
                status: ActuationStatus, detail: str) -> None:
        self._send_result(ActuationResult(
            actuation_id=command.actuation_id, identity=identity,
            action_kind=command.action.kind.value, status=status, detail=detail[:2048],
            command_time_ms=command.event_time_ms,
        ))

    def _send_result(self, result: ActuationResult) -> None:
        self.results[result.status] += 1
        self._actuations.labels(SERVICE, action_label(result.action_kind),
                                result.status.value).inc()
        try:
            self._publish(self.config.results_topic, self.config.node_id.encode(),
                          encode(result))
            self._results_out.inc()
        except Exception:  # a lost result is logged; the node keeps serving its workers
            log.exception("dsec node actuator: result for %s not published",
                          result.actuation_id)

    def _save_desired_state(self) -> None:
        body = orjson.dumps([c.model_dump(mode="json", exclude_none=True)
                             for c in self._book.commands()])
        try:
            write_atomically(self._state_path, body)
        except OSError as exc:
            log.warning("dsec node actuator: desired state not saved: %s", exc)

    def _load_desired_state(self) -> None:
        """Commands saved by an earlier run, re-verified: the file is input like any other."""
        try:
            saved = orjson.loads(self._state_path.read_bytes())
        except FileNotFoundError:
            return
        except (OSError, orjson.JSONDecodeError) as exc:
            log.warning("dsec node actuator: saved desired state unreadable: %s", exc)
            return
        for raw in saved if isinstance(saved, list) else []:
            try:
                command = ActuationCommand.model_validate(raw)
                verify(command, self.config.signing_key)
            except (ValidationError, SignatureError) as exc:
                log.warning("dsec node actuator: dropped a saved command: %s", exc)
                continue
            self._gate.check(command, command.event_time_ms)  # remembered as seen
            self._book.accept(command)
            self._book.mark_delivered(worker_key(command), command.actuation_id)


def _same_user(sock: socket.socket) -> bool:
    """The peer runs as this user (Linux ``SO_PEERCRED``; elsewhere the 0600 socket and
    0700 run directory are the whole check)."""
    peercred = getattr(socket, "SO_PEERCRED", None)
    if peercred is None:
        return True
    credentials = sock.getsockopt(socket.SOL_SOCKET, peercred, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", credentials)
    return uid == os.getuid()


def _apply_frame(command: ActuationCommand, replay: bool) -> Apply:
    return Apply(actuation_id=command.actuation_id, action=command.action,
                 command_time_ms=command.event_time_ms, replay=replay)
