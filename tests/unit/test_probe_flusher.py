"""One flush (the buffer to the transport, then a heartbeat when due) and the thread that
decides when, on a clock the test moves."""

from __future__ import annotations

import threading

import orjson
import pytest
from recording import IDENTITY, RecordingTransport

from dsec.ingest.buffer import SampleBuffer
from dsec.ingest.clock import ManualClock
from dsec.ingest.flush_thread import URGENT_GAP_S, FlushThread, urgent_wait_s
from dsec.ingest.flusher import BatchMessages, Flusher

HEARTBEAT_INTERVAL_S = 5.0


def _flusher(transport: RecordingTransport, clock: ManualClock, buffer: SampleBuffer,
             before_send=lambda: None, per_message: int = 3) -> Flusher:
    return Flusher(buffer, transport, IDENTITY, "metrics", clock,
                   max_samples_per_message=per_message,
                   heartbeat_interval_s=HEARTBEAT_INTERVAL_S, global_step=lambda: 42,
                   before_send=before_send)


def _episode(index: int) -> tuple:
    return ("episode", 1_700_000_000_000 + index, index, 1.0, 10, True, False, None)


def test_a_flush_runs_its_chores_first_then_sends_the_buffer_in_bounded_messages() -> None:
    transport, clock, buffer = RecordingTransport(), ManualClock(), SampleBuffer(100)
    chores: list[int] = []
    flusher = _flusher(transport, clock, buffer, before_send=lambda: (
        chores.append(len(transport.messages)), buffer.record(_episode(99))))
    for index in range(6):
        buffer.record(_episode(index))
    flusher.flush()
    assert chores == [0]  # before anything was sent
    assert [len(batch.rows()) for batch in transport.batches()] == [3, 3, 1]
    flusher.flush()  # only what its chores recorded
    assert [len(batch.rows()) for batch in transport.batches()][3:] == [1]
    transport.poll()
    assert buffer.counters().samples_sent == 8


def test_heartbeats_follow_the_clock() -> None:
    transport, clock, buffer = RecordingTransport(), ManualClock(), SampleBuffer(100)
    flusher = _flusher(transport, clock, buffer)
    flusher.flush()
    assert transport.samples("heartbeat") == []  # not started: none owed yet
    clock.advance(HEARTBEAT_INTERVAL_S - 0.001)
    flusher.flush()
    assert transport.samples("heartbeat") == []
    clock.advance(0.001)
    flusher.flush()
    flusher.flush()  # the next is an interval away
    flusher.heartbeat_at_next_flush()
    flusher.flush()
    flusher.flush(force_heartbeat=True)
    heartbeats = transport.samples("heartbeat")
    assert len(heartbeats) == 3 and {h.step for h in heartbeats} == {42}
    assert heartbeats[0].event_time_ms == clock.now_ms()


def test_a_refusing_transport_keeps_the_samples_for_the_next_flush() -> None:
    transport, clock, buffer = RecordingTransport(), ManualClock(), SampleBuffer(100)
    flusher = _flusher(transport, clock, buffer)
    for index in range(4):
        buffer.record(_episode(index))
    transport.accepting = False
    flusher.flush()
    assert buffer.counters().samples_buffered == 4 and not transport.messages
    transport.accepting = True
    flusher.flush()
    assert [row.episode_index for row in transport.samples("episode")] == [0, 1, 2, 3]


def test_a_lost_message_of_another_kind_is_counted() -> None:
    transport, clock, buffer = RecordingTransport(), ManualClock(), SampleBuffer(100)
    flusher = _flusher(transport, clock, buffer)
    transport.deliver = False
    flusher.publish("results", b"n0", b"{}")
    transport.poll()
    transport.accepting = False
    flusher.publish("results", b"n0", b"{}")
    assert buffer.counters().messages_failed == 2


def test_messages_carry_the_identity_and_ids_unique_to_the_probe() -> None:
    messages, other = BatchMessages(IDENTITY), BatchMessages(IDENTITY)
    first = orjson.loads(messages.encode([_episode(0)], 1_700_000_000_123))
    second = orjson.loads(messages.encode([_episode(1)], 1_700_000_000_124))
    elsewhere = orjson.loads(other.encode([_episode(0)], 1_700_000_000_123))
    assert first["event_time_ms"] == 1_700_000_000_123
    assert first["identity"]["worker_id"] == "w0"
    assert first["event_id"][:16] == second["event_id"][:16] != elsewhere["event_id"][:16]
    assert first["event_id"] != second["event_id"]


@pytest.mark.parametrize(("interval_s", "since_s", "expected_s"), [
    (0.25, 0.0, URGENT_GAP_S),  # right after a flush: waits the gap
    (0.25, 0.015, URGENT_GAP_S - 0.015),
    (0.25, 0.25, URGENT_GAP_S - 0.25),  # long ago (the interval itself): at once
    (0.01, 0.0, 0.01),  # never longer than the interval
])
def test_an_early_flush_waits_out_the_gap(interval_s: float, since_s: float,
                                         expected_s: float) -> None:
    assert urgent_wait_s(interval_s, since_s) == pytest.approx(expected_s)


def test_the_thread_flushes_when_asked_and_once_more_with_a_heartbeat_when_stopped() -> None:
    flushes: list[bool] = []
    flushed = threading.Event()

    def flush(force_heartbeat: bool) -> None:
        flushes.append(force_heartbeat)
        flushed.set()
        if len(flushes) == 2:
            raise RuntimeError("a bad flush")  # the thread outlives it

    thread = FlushThread(flush, interval_s=60.0, clock=ManualClock())
    thread.start()
    thread.start()  # once
    for _ in range(2):
        flushed.clear()
        thread.flush_soon()  # as a NaN sample does: not at the interval, 60 s away
        assert flushed.wait(timeout=5)
    thread.stop()
    assert flushes == [False, False, True] and not thread.running
