"""A single-process actuator: the probe consumes its own commands, without a node daemon.

A consumer thread reads the actuation topic from the moment of start, keeps the
commands addressed to this worker, and queues them; the training thread applies
them at its next step boundary (``apply_pending``), where changing the model,
optimizer or precision is safe, and results are published back.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from dsec.actuators.apply_hooks import ApplyHooks
from dsec.actuators.desired_state import DesiredStateBook, OutOfOrder
from dsec.actuators.gate import CommandGate, out_of_bounds_result
from dsec.schemas import (
    ActuationCommand,
    ActuationResult,
    ActuationStatus,
    DecodeError,
    WorkerIdentity,
    decode,
    encode,
    now_ms,
)
from dsec.schemas.actuations import COMMAND_MAX_FUTURE_MS

log = logging.getLogger(__name__)

Publish = Callable[[str, bytes, bytes], None]  # (topic, key, value)


class InProcessActuator:
    def __init__(
        self,
        identity: WorkerIdentity,
        consumer_config: dict,
        actuations_topic: str,
        results_topic: str,
        hooks: ApplyHooks,
        signing_key: bytes,
        publish: Publish,
        on_command: Callable[[], None] = lambda: None,
        max_future_ms: int = COMMAND_MAX_FUTURE_MS,
    ) -> None:
        """``on_command`` is called (on the consumer's thread) after a command is queued for
        ``apply_pending``: the probe's ``wake``, so that the next step boundary applies it."""
        self.identity = identity
        self.hooks = hooks
        self._consumer_config = {**consumer_config, "enable.auto.commit": False}
        self._actuations_topic = actuations_topic
        self._results_topic = results_topic
        self._gate = CommandGate(identity, signing_key, max_future_ms=max_future_ms)
        self._order = DesiredStateBook()  # rejects a command older than the one in force
        self._publish = publish
        self._on_command = on_command
        self._inbox: queue.SimpleQueue[ActuationCommand] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self.undecodable = 0
        self.results: dict[ActuationStatus, int] = dict.fromkeys(ActuationStatus, 0)

    def start(self, ready_timeout_s: float = 30.0) -> None:
        self._thread = threading.Thread(target=self._run, name="dsec-actuator", daemon=True)
        self._thread.start()
        if not self._ready.wait(ready_timeout_s):
            log.warning("dsec actuator: no assignment after %.0f s; commands may be late",
                        ready_timeout_s)

    def _assign_from_end(self, consumer: Consumer) -> None:
        metadata = consumer.list_topics(self._actuations_topic, timeout=10)
        partitions = metadata.topics[self._actuations_topic].partitions
        assignment = []
        for partition in partitions:
            _low, high = consumer.get_watermark_offsets(
                TopicPartition(self._actuations_topic, partition), timeout=10
            )
            assignment.append(TopicPartition(self._actuations_topic, partition, high))
        consumer.assign(assignment)

    def _assign_with_retries(self, consumer: Consumer, attempts: int = 20) -> None:
        """A topic created moments ago may have no partition leader yet: retry a while."""
        for attempt in range(attempts):
            try:
                self._assign_from_end(consumer)
                return
            except KafkaException as exc:
                if attempt == attempts - 1 or self._stop.wait(0.5):
                    raise
                log.info("dsec actuator: assignment retried: %s", exc)

    def _run(self) -> None:
        consumer = Consumer(self._consumer_config)
        try:
            self._assign_with_retries(consumer)
            self._ready.set()
            while not self._stop.is_set():
                message = consumer.poll(0.2)
                if message is None:
                    continue
                if message.error():
                    if message.error().code() != KafkaError._PARTITION_EOF:
                        log.warning("dsec actuator: %s", message.error())
                    continue
                self._receive(message.value())
        except Exception:
            log.exception("dsec actuator: consumer stopped")
        finally:
            self._ready.set()
            consumer.close()

    def _receive(self, value: bytes | None) -> None:
        try:
            command = decode(value, ActuationCommand)
        except DecodeError as exc:
            self.undecodable += 1
            rejection = out_of_bounds_result(value, exc.reason)
            if rejection is not None and rejection.identity == self.identity:
                self._send(rejection)
            else:
                log.warning("dsec actuator: undecodable command: %s", exc.reason)
            return
        if self._gate.addressed_here(command):
            self._inbox.put(command)
            self._on_command()

    def apply_pending(self) -> int:
        """Applies queued commands; call on the training thread at a step boundary."""
        applied = 0
        while True:
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return applied
            self._handle(command)
            applied += 1

    def _handle(self, command: ActuationCommand) -> None:
        rejection = self._gate.check(command, now_ms())
        if rejection is not None:
            if not rejection.duplicate and self._gate.reportable(command, rejection):
                self._report(command, rejection.status, rejection.detail)
            return
        verdict = self._order.accept(command)
        if isinstance(verdict, OutOfOrder):
            self._report(command, ActuationStatus.STALE,
                         f"out of order: a newer {command.action.kind.value} command "
                         f"(t={verdict.newer_time_ms}) is already in force")
            return
        try:
            detail = self.hooks.apply(command.action, command.actuation_id)
        except Exception as exc:  # the hook's failure is reported, never raised into training
            self._report(command, ActuationStatus.FAILED, f"{type(exc).__name__}: {exc}")
            return
        self._report(command, ActuationStatus.APPLIED, detail)

    def _report(self, command: ActuationCommand, status: ActuationStatus, detail: str) -> None:
        self._send(ActuationResult(
            actuation_id=command.actuation_id,
            identity=self.identity,
            action_kind=command.action.kind.value,
            status=status,
            detail=detail[:2048],
            command_time_ms=command.event_time_ms,
        ))

    def _send(self, result: ActuationResult) -> None:
        self.results[result.status] += 1
        self._publish(self._results_topic, self.identity.node_id.encode(), encode(result))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
