"""One flush: the buffered samples go to the transport, a message's worth at a time, and a
heartbeat follows when one is due. Whoever calls ``flush`` decides when (the flush thread,
every flush interval, or a test); a lock keeps two callers from interleaving.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import orjson

from dsec.ingest.buffer import SampleBuffer
from dsec.ingest.clock import Clock
from dsec.ingest.encode import batch_columns, pack_long_columns
from dsec.ingest.transport import Transport
from dsec.schemas import SCHEMA_VERSION, WorkerIdentity, new_event_id

log = logging.getLogger(__name__)


class BatchMessages:
    """Samples as ``MetricBatch`` messages of one worker.

    Message ids are a random 64-bit prefix per probe and a counter: a uuid4 per message
    costs a system call, ~70 us on the flusher's cold start.
    """

    def __init__(self, identity: WorkerIdentity) -> None:
        self._identity_fields = identity.model_dump()
        self.id_prefix = new_event_id()[:16]
        self._messages_encoded = 0
        # The GPU this process uses, once known: the stream jobs learn from it which
        # workers share a card.
        self.gpu_uuid: str | None = None

    def encode(self, chunk: list[tuple], event_time_ms: int) -> bytes:
        self._messages_encoded += 1
        document = {
            "schema_version": SCHEMA_VERSION,
            "event_id": f"{self.id_prefix}{self._messages_encoded:016x}",
            "event_time_ms": event_time_ms,
            "identity": self._identity_fields,
            "columns": pack_long_columns(batch_columns(chunk)),
        }
        if self.gpu_uuid is not None:
            document["gpu_uuid"] = self.gpu_uuid
        return orjson.dumps(document)


class Flusher:
    def __init__(
        self,
        buffer: SampleBuffer,
        transport: Transport,
        identity: WorkerIdentity,
        topic: str,
        clock: Clock,
        *,
        max_samples_per_message: int,
        heartbeat_interval_s: float,
        global_step: Callable[[], int],
        before_send: Callable[[], None],
    ) -> None:
        """``before_send`` runs at the start of every flush (the work that rides on the
        flusher's schedule); ``global_step`` is read for the heartbeat."""
        self._buffer = buffer
        self._transport = transport
        self._messages = BatchMessages(identity)
        self._topic = topic
        self._key = identity.worker_id.encode()
        self._clock = clock
        self._max_samples_per_message = max_samples_per_message
        self._heartbeat_interval_s = heartbeat_interval_s
        self._global_step = global_step
        self._before_send = before_send
        self._flushing = threading.Lock()
        self._last_heartbeat_s = clock.monotonic_s()  # a probe not yet started owes none

    @property
    def message_id_prefix(self) -> str:
        return self._messages.id_prefix

    def name_gpu(self, gpu_uuid: str) -> None:
        """The messages from now on name ``gpu_uuid`` as this process's GPU."""
        self._messages.gpu_uuid = gpu_uuid

    def heartbeat_at_next_flush(self) -> None:
        """The next flush sends a heartbeat (the first flush of a started probe says the
        worker is here)."""
        self._last_heartbeat_s = float("-inf")

    def flush(self, force_heartbeat: bool = False) -> None:
        """Serves the transport's delivery reports, runs ``before_send``, hands over every
        buffered sample the transport takes, then adds the heartbeat when due (after the
        backlog, so that it finds room and fresh counts)."""
        with self._flushing:
            self._transport.poll()
            self._before_send()
            while self._send_chunk():
                pass
            now_s = self._clock.monotonic_s()
            if force_heartbeat or now_s - self._last_heartbeat_s >= self._heartbeat_interval_s:
                self._last_heartbeat_s = now_s
                self._buffer.record_heartbeat(self._clock.now_ms(), self._heartbeat_interval_s,
                                              self._global_step())
                while self._send_chunk():
                    pass

    def _send_chunk(self) -> bool:
        """Hands the oldest samples, one message's worth, to the transport.

        False when nothing is left or the transport refused (its queue is full): the chunk
        goes back to the front of the buffer.
        """
        buffer = self._buffer
        chunk = buffer.take(self._max_samples_per_message)
        if not chunk:
            return False
        count = len(chunk)

        def on_delivery(delivered: bool, error: str) -> None:
            buffer.delivered(count, delivered)
            if not delivered:
                log.warning("dsec: %d samples lost: %s", count, error)

        try:
            value = self._messages.encode(chunk, self._clock.now_ms())
            accepted = self._transport.send(self._topic, self._key, value, on_delivery)
        except Exception:  # unencodable or unsendable: this chunk is lost, and counted
            log.exception("dsec: %d samples could not be sent", count)
            buffer.lost(count)
            return True
        buffer.handed_over(chunk, accepted)
        return accepted

    def publish(self, topic: str, key: bytes, value: bytes) -> None:
        """Sends a message of another kind (an actuation result) through the transport; a
        lost one is counted in ``messages_failed``."""

        def on_delivery(delivered: bool, error: str) -> None:
            if not delivered:
                self._buffer.message_failed()
                log.warning("dsec: message to %s lost: %s", topic, error)

        if not self._transport.send(topic, key, value, on_delivery):
            self._buffer.message_failed()
