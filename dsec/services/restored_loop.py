"""A service that reads its state back from compacted topics, then runs one consumer loop
under a supervisor (the alert notifier, the personality service).

``RestoredLoopService`` gives such a service its start, health and stop; ``read_to_end``
reads state topics from their beginnings to the ends they had when it started.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import Consumer, Message

from dsec.infra.consumer_loop import (
    BatchWriter,
    ConsumerLoop,
    ConsumerLoopConfig,
    OutputUnavailable,
    Start,
)
from dsec.infra.kafka_clients import consumer_config
from dsec.infra.supervisor import LoopSupervisor
from dsec.schemas.settings import DsecSettings

__all__ = ["RestoredLoopService", "read_to_end"]


class RestoredLoopService:
    """Subclasses set ``_loop``, ``_stop``, ``_producer`` and ``_dead_letters`` in their
    ``__init__`` and define ``restore()``, which runs on the loop's thread before the loop:
    a restart reads the state back before it consumes again."""

    thread_name = "dsec-service"
    not_running = "the service is not running"
    _loop: ConsumerLoop
    _stop: threading.Event
    _producer: Any
    _dead_letters: Any
    _supervisor: LoopSupervisor | None = None

    def restore(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._supervisor = LoopSupervisor(self._run, self.thread_name, self._stop)
        self._supervisor.start()

    def wait_assigned(self, timeout_s: float) -> bool:
        return self._loop.wait_assigned(timeout_s)

    def health(self) -> str | None:
        if self._supervisor is None:
            return self.not_running
        return self._supervisor.down() or self._loop.down()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        supervisor, self._supervisor = self._supervisor, None
        ended = supervisor is None or supervisor.join(timeout_s)
        self._producer.flush(timeout_s)
        self._dead_letters.close(timeout_s, release=ended)

    def _run(self) -> None:
        self.restore()
        self._loop.run()


def read_to_end(settings: DsecSettings, topics: Sequence[str],
                writer: BatchWriter[Sequence[Message]], *, group_prefix: str, service: str,
                what: str, timeout_s: float,
                consumer_factory: Callable[[dict], Any] = Consumer) -> None:
    """Hands ``writer`` every record of ``topics`` up to the ends they had at the start (a
    record that cannot be read is skipped: the writer logs it where it reads); raises
    ``OutputUnavailable`` naming ``what`` when the ends are not reached in ``timeout_s``."""
    group = f"{group_prefix}-{uuid.uuid4().hex[:8]}"
    loop = ConsumerLoop(
        ConsumerLoopConfig(tuple(topics), group, poll_timeout_s=0.2, start=Start.BEGINNING,
                           assign=True, until_end=True, commit=False,
                           metadata_timeout_s=timeout_s),
        consumer_config(settings, group), writer, _skip, service=f"{service}-restore",
        consumer_factory=consumer_factory)
    if not loop.run(timeout_s=timeout_s):
        raise OutputUnavailable(f"{what} were not read to their ends in {timeout_s:.0f} s")


def _skip(_message: Message, _reason: str) -> None:
    """A record of a state topic that cannot be read is skipped (logged where read)."""
