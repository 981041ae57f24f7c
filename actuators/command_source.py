"""Commands off the actuation topic, on a ``ConsumerLoop`` kept running by a supervisor.

Commands are keyed by the node of their target. A message keyed to a node this source
does not serve is passed over before it is decoded or verified, so traffic to other
nodes, forged or not, costs one key comparison. The rest is decoded and handed on one
message at a time (``take``); a message that is not a valid command goes to
``undecodable``. Offsets are committed once a whole batch has been handled, and a message
whose handling raised is dead-lettered without the others being handled again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, Message

from dsec.actuators.results import Publish
from dsec.infra.consumer_loop import (
    BatchWriter,
    ConsumerLoop,
    ConsumerLoopConfig,
    DeadLetter,
    FailedMessages,
    failure_reason,
)
from dsec.infra.observability.metrics import EVENTS_IN, ProcessMetrics
from dsec.infra.supervisor import LoopSupervisor
from dsec.schemas import ActuationCommand, DecodeError, decode, encode
from dsec.schemas.dead_letters import DeadLetter as DeadLetterEvent

log = logging.getLogger(__name__)

Take = Callable[[ActuationCommand], Any]
Undecodable = Callable[[bytes | None, str], None]
RESTART_MAX_DELAY_S = 5.0  # a node started before its topic exists finds it soon after


def dead_letters_to(topic: str | None, publish: Publish, service: str) -> DeadLetter:
    """A dead-letter callback that publishes to ``topic`` through the actuator's own
    ``publish``, as its results are (handed to the producer, not waited for); None: logged
    only. The loop counts it either way."""
    def dead_letter(message: Message, reason: str) -> None:
        if topic is None:
            log.error("%s: no dead-letter topic for %s@%d:%d: %s", service, message.topic(),
                      message.partition(), message.offset(), reason)
            return
        letter = DeadLetterEvent.for_message(
            topic=message.topic(), partition=message.partition(), offset=message.offset(),
            reason=reason, payload=message.value())
        publish(topic, message.topic().encode(), encode(letter))
    return dead_letter


class CommandSource(BatchWriter[Sequence[Message]]):
    def __init__(
        self,
        loop: ConsumerLoopConfig,
        client_config: Mapping[str, Any],
        *,
        keys: Callable[[], Collection[str]],
        take: Take,
        undecodable: Undecodable,
        dead_letter: DeadLetter,
        service: str,
        thread_name: str,
        metrics: ProcessMetrics | None = None,
        consumer_factory: Callable[[dict], Any] = Consumer,
    ) -> None:
        """``keys``: the node ids whose commands to read, asked once a batch (the runtimes
        registered with a gateway change while it runs)."""
        self._keys = keys
        self._service = service
        self._take = take
        self._undecodable = undecodable
        self._events_in = (metrics.counter(EVENTS_IN).labels(service, loop.topics[0])
                           if metrics is not None else None)
        self.loop: ConsumerLoop[Sequence[Message]] = ConsumerLoop(
            loop, client_config, self, dead_letter, service=service, metrics=metrics,
            consumer_factory=consumer_factory)
        self._supervisor = LoopSupervisor(self.loop.run, thread_name, self.loop.stop_event,
                                          max_delay_s=RESTART_MAX_DELAY_S)
        self.passed_over = 0  # messages keyed to other nodes

    def start(self) -> None:
        self._supervisor.start()

    def wait_ready(self, timeout_s: float) -> bool:
        """Whether the loop took its partitions within ``timeout_s``."""
        return self.loop.wait_assigned(timeout_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        self.loop.stop()
        self._supervisor.join(timeout_s)

    def down(self) -> str | None:
        """None while the loop runs and comes round, else why not."""
        return self._supervisor.down() or self.loop.down()

    def write(self, batch: Sequence[Message]) -> None:
        if self._events_in is not None:
            self._events_in.inc(len(batch))
        keys = {key.encode() for key in self._keys()}
        failures = []
        for message in batch:
            if message.key() not in keys:
                self.passed_over += 1
                continue
            try:
                self.receive(message.value())
            except Exception as exc:
                log.exception("%s: command not handled", self._service)
                failures.append((message, failure_reason(exc)))
        if failures:
            raise FailedMessages(failures)

    def receive(self, value: bytes | None) -> Any:
        """One message's value: decoded and taken (what ``take`` returns), or undecodable."""
        try:
            command = decode(value, ActuationCommand)
        except DecodeError as exc:
            self._undecodable(value, exc.reason)
            return None
        return self._take(command)
